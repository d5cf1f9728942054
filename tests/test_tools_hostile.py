"""Hostile files and patterns end with a clear error in bounded time and memory, and the bot
keeps answering: the event loop is never late by 100 ms and another channel's read goes on.

Each case ran in the bot's process before tools.worker: the pattern froze the loop for
seconds, the Python file's syntax tree took gigabytes, the PDF kept pypdf busy for seconds per
page, and the ICO decoded a 324 MB image while being opened.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox.paths import Workspace
from tests.hostile_files import (
    CATASTROPHIC_PATTERN,
    catastrophic_line,
    ico_bomb,
    stalling_pdf,
    with_loop_lag,
)
from tools import ToolContext, default_registry, worker
import tools.media
import tools.search

REGISTRY = default_registry()
ROOT = Path(__file__).resolve().parents[1]
MAX_LAG_S = 0.1


@pytest.fixture
def ctx(tmp_path):
    return ToolContext.open("hostile", Workspace(tmp_path / "ws"), tmp_path / "state",
                            image_cache=str(tmp_path / "images"))


@pytest.fixture
def other(tmp_path):
    other = ToolContext.open("other", Workspace(tmp_path / "other"), tmp_path / "other-state")
    (other.workspace.root / "hello.txt").write_text("hello from another channel\n")
    return other


async def hostile(ctx, other, name: str, arguments: dict):
    """Call ``name`` while another channel reads a file: (result, seconds, loop lag, the other
    channel's result and seconds)."""

    async def other_channel():
        await asyncio.sleep(0.2)  # once the hostile call is under way
        start = time.perf_counter()
        result = await REGISTRY.call("read_file", {"path": "hello.txt"}, other)
        return result, time.perf_counter() - start

    start = time.perf_counter()
    (result, (theirs, their_s)), lag = await with_loop_lag(
        asyncio.gather(REGISTRY.call(name, arguments, ctx), other_channel()))
    assert theirs.ok and "hello from another channel" in theirs.output
    return result, time.perf_counter() - start, lag, their_s


async def test_a_catastrophic_pattern_is_stopped_and_the_loop_never_waits(ctx, other, monkeypatch):
    monkeypatch.setattr(tools.search, "GREP_LIMITS", worker.Limits(memory_mb=512, cpu_s=2,
                                                                   timeout_s=3))
    (ctx.workspace.root / "a.txt").write_text("fine line\n" + catastrophic_line(28))
    result, seconds, lag, their_s = await hostile(ctx, other, "grep",
                                                  {"pattern": CATASTROPHIC_PATTERN})
    assert not result.ok and "was stopped" in result.output and "backtrack" in result.output
    assert seconds < 8 and lag < MAX_LAG_S and their_s < 1


async def test_grep_still_answers_ordinary_searches_through_the_worker(ctx):
    (ctx.workspace.root / "src").mkdir()
    (ctx.workspace.root / "src/a.py").write_text("def main():\n    pass  # TODO\n")
    (ctx.workspace.root / "b.txt").write_text(catastrophic_line(28))
    found = await REGISTRY.call("grep", {"pattern": r"TODO|def \w+", "glob": "*.py"}, ctx)
    assert found.ok and found.output.splitlines()[:2] == ["src/a.py:1: def main():",
                                                          "src/a.py:2: pass  # TODO"]
    one = await REGISTRY.call("grep", {"pattern": "a+b", "path": "b.txt"}, ctx)
    assert one.ok and one.output.startswith("b.txt:1: aaaa")


async def test_a_huge_python_file_is_refused_at_once(ctx, other):
    (ctx.workspace.root / "huge.py").write_bytes(b"x = [1, 2, 3]\n" * 300_000)  # 4.2 MB
    result, seconds, lag, _ = await hostile(ctx, other, "outline", {"path": "huge.py"})
    assert not result.ok and "4.0 MiB" in result.output and "up to 1 MiB" in result.output
    assert "grep" in result.output  # what to do instead
    assert seconds < 3 and lag < MAX_LAG_S


async def test_a_python_tree_over_the_memory_limit_is_stopped_with_a_clear_error(ctx, other,
                                                                                 monkeypatch):
    monkeypatch.setattr(tools.search, "OUTLINE_LIMITS", worker.Limits(memory_mb=100, cpu_s=10,
                                                                      timeout_s=15))
    (ctx.workspace.root / "flat.py").write_bytes(b"a=1\n" * 100_000)  # 400 KB, under the cap
    result, seconds, lag, _ = await hostile(ctx, other, "outline", {"path": "flat.py"})
    assert not result.ok and "needed more than 100 MiB of memory" in result.output
    assert seconds < 15 and lag < MAX_LAG_S


async def test_a_pdf_made_to_stall_is_stopped_in_bounded_time(ctx, other, monkeypatch):
    monkeypatch.setattr(tools.media, "PDF_LIMITS", worker.Limits(memory_mb=1024, cpu_s=3,
                                                                 timeout_s=4))
    (ctx.workspace.root / "stall.pdf").write_bytes(stalling_pdf(pages=3))
    result, seconds, lag, their_s = await hostile(ctx, other, "read_pdf", {"path": "stall.pdf"})
    assert not result.ok and "reading stall.pdf" in result.output and "stopped" in result.output
    assert seconds < 10 and lag < MAX_LAG_S and their_s < 1


async def test_a_decompression_bomb_is_refused_before_it_is_decoded(ctx, other, tmp_path):
    (ctx.workspace.root / "bomb.ico").write_bytes(ico_bomb(9000))
    result, seconds, lag, _ = await hostile(ctx, other, "view_image", {"path": "bomb.ico"})
    assert not result.ok and "81,000,000 pixels" in result.output and "limit" in result.output
    assert seconds < 10 and lag < MAX_LAG_S
    assert not (tmp_path / "images").exists() or not any((tmp_path / "images").iterdir())


PEAK_SCRIPT = """
import asyncio, json, resource, sys
from pathlib import Path
from sandbox.paths import Workspace
from tools import ToolContext, default_registry

async def main(base):
    ctx = ToolContext.open("bomb", Workspace(Path(base) / "ws"), Path(base) / "state",
                           image_cache=str(Path(base) / "images"))
    result = await default_registry().call("view_image", {"path": "bomb.ico"}, ctx)
    # VmHWM, not ru_maxrss: Linux carries the parent's peak across fork and exec, so
    # ru_maxrss would count pytest's own memory.
    hwm_kb = next(int(line.split()[1]) for line in open("/proc/self/status")
                  if line.startswith("VmHWM:"))
    print(json.dumps({"ok": result.ok, "output": result.output,
                      "self_mb": hwm_kb // 1024,
                      "worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024}))

asyncio.run(main(sys.argv[1]))
"""


def test_the_bots_memory_stays_flat_when_a_bomb_is_viewed(tmp_path):
    """In a fresh process, so its peak memory is this call's alone."""
    Workspace(tmp_path / "ws")
    (tmp_path / "ws/bomb.ico").write_bytes(ico_bomb(9000))
    done = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(tmp_path)], cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(done.stdout)
    assert not seen["ok"] and "too large an image" in seen["output"]
    # Decoding it takes 324 MB; the bot's process and the worker both stay far below.
    assert seen["self_mb"] < 150 and seen["worker_mb"] < 150, seen
