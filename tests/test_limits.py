"""Issue 11, part 2: limits for all channels together (jobs, disk, memory), through the
real sandbox; and a full workspace never stops the store or other channels.

Each test here failed on the code before the fix it names.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.runtime import Runtime
from core.config import Config
from sandbox.paths import Workspace
from sandbox.process import Limits, Sandbox
from sandbox.shared_limits import MemoryBudget, usage_bytes
from tests.scripted import ScriptedLLM, call, say
from tests.test_nightwatch import SwappingServer
from tools import ToolContext, default_registry
from tools.jobs import JobSlots

REGISTRY = default_registry()
SLEEP = "import time\ntime.sleep(30)"


ROOT = Path(__file__).resolve().parent.parent


def need_bwrap() -> None:
    if not Sandbox().sandboxed:
        pytest.fail("bubblewrap 0.8+ is missing. Fix: apt-get install bubblewrap.",
                    pytrace=False)


@pytest.fixture
async def contexts(tmp_path: Path):
    """Contexts of channels that share one sandbox and one JobSlots (as in the runtime)."""
    need_bwrap()
    made: list[ToolContext] = []

    def make(channel: str, **services) -> ToolContext:
        ctx = ToolContext.open(channel, Workspace(tmp_path / f"ws-{channel}"),
                               tmp_path / f"state-{channel}", **services)
        made.append(ctx)
        return ctx

    yield make
    for ctx in made:
        runner = ctx.services.jobs_runner
        if runner is not None:
            await runner.close()


async def test_jobs_are_capped_per_channel_and_in_total(contexts):
    slots = JobSlots(per_channel=1, total=2)
    a, b, c = (contexts(name, job_slots=slots) for name in "abc")
    assert (await REGISTRY.call("job_start", {"code": SLEEP}, a)).ok
    second = await REGISTRY.call("job_start", {"code": SLEEP}, a)
    assert not second.ok and "most allowed at once (1)" in second.output
    assert (await REGISTRY.call("job_start", {"code": SLEEP}, b)).ok
    third = await REGISTRY.call("job_start", {"code": SLEEP}, c)
    assert not third.ok and "over all channels" in third.output
    stopped = await REGISTRY.call("job_stop", {"job_id": "j1"}, a)
    assert stopped.ok, stopped.output  # frees a slot
    assert (await REGISTRY.call("job_start", {"code": SLEEP}, c)).ok


# -- disk: a quota per workspace ------------------------------------------------------

FILL = ("import os, time\nos.makedirs('fill', exist_ok=True)\nfor i in range(2000):\n"
        "    with open(f'fill/{i}.bin', 'wb') as f:\n        f.write(os.urandom(1 << 20))\n"
        "    time.sleep(0.01)\n")  # up to 2 GB at about 100 MB/s, without a quota


async def test_a_file_write_past_the_quota_is_refused_and_undo_still_works(contexts):
    ctx = contexts("a", workspace_quota_bytes=1 << 20)
    assert (await REGISTRY.call("write_file", {"path": "a.txt", "content": "x" * 600_000},
                                ctx)).ok
    full = await REGISTRY.call("write_file", {"path": "b.txt", "content": "y" * 600_000}, ctx)
    assert not full.ok and "the workspace is full" in full.output
    assert "sandbox.workspace_quota_mb" in full.output
    assert not (ctx.workspace.root / "b.txt").exists()
    assert (await REGISTRY.call("undo", {}, ctx)).ok  # the journal keeps working
    assert not (ctx.workspace.root / "a.txt").exists()
    assert (await REGISTRY.call("write_file", {"path": "b.txt", "content": "y" * 600_000},
                                ctx)).ok


async def test_a_program_that_fills_its_workspace_is_stopped_at_the_quota(tmp_path):
    need_bwrap()
    box = Sandbox(limits=Limits(workspace_mb=5, timeout_s=30))
    workspace = Workspace(tmp_path / "ws")
    result = await box.run(["python3", "-c", FILL], workspace)
    assert result.killed and not result.timed_out
    assert "the workspace is full" in result.stderr and result.duration_s < 10
    assert usage_bytes(workspace.root) < 40 << 20  # the quota, plus a moment of writing


async def test_a_full_workspace_does_not_stop_other_channels_turns_from_being_stored(tmp_path):
    need_bwrap()
    config = Config()
    config.paths.data_dir = tmp_path
    config.sandbox.workspace_quota_mb = 5
    config.agent.tools = "all"  # run_python is not in the embedded model's core set

    def script(messages, kwargs):
        last = messages[-1]
        if last["role"] == "user" and last["content"] == "fill your disk":
            return call("run_python", {"code": FILL, "timeout_s": 60})
        if last["role"] == "tool":
            return say("FULL" if "the workspace is full" in last["content"] else "NOT FULL")
        return say("hi " + last["content"])

    rt = await Runtime.start(config, supervisor=SwappingServer(tmp_path / "base.gguf"),
                             llm=ScriptedLLM(script), start_server=False)
    try:
        filled, other = await asyncio.gather(rt.turn("greedy", "fill your disk"),
                                             rt.turn("quiet", "hello"))
        assert filled.reply == "FULL"  # the program was stopped, and the agent told why
        assert other.ok and other.reply == "hi hello"
        after = await rt.turn("quiet", "again")
        assert after.reply == "hi again"
        episodes = await rt.store.episodes_since(0)
        assert sorted((e.channel_id, e.status) for e in episodes) == [
            ("greedy", "complete"), ("quiet", "complete"), ("quiet", "complete")]
        greedy = rt.spaces.context("greedy")
        refused = await rt.registry.call("write_file", {"path": "x.txt", "content": "x" * 4096},
                                         greedy)
        assert not refused.ok and "the workspace is full" in refused.output
    finally:
        await rt.close()


# -- memory: all sandboxed programs together ----------------------------------------------

HOG = "x = bytearray(200 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\nprint('held')"


CGROUP_SCRIPT = """
import asyncio, json, sys
from pathlib import Path
from sandbox.paths import Workspace
from sandbox.process import Limits, Sandbox
from sandbox.shared_limits import MemoryBudget

async def main(base, hog):
    budget = MemoryBudget(128)
    if budget.cgroup_procs is None:
        print(json.dumps({"cgroup": False}))
        return
    capped = await Sandbox(limits=Limits(address_space_mb=1024), memory=budget).run(
        ["python3", "-c", hog], Workspace(Path(base) / "ws"))
    alone = await Sandbox(limits=Limits(address_space_mb=1024)).run(
        ["python3", "-c", hog], Workspace(Path(base) / "ws"))
    print(json.dumps({"cgroup": True, "capped": [capped.ok, capped.stdout],
                      "alone": [alone.ok, alone.stdout]}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_the_memory_of_all_runs_together_is_capped_by_the_cgroup(tmp_path):
    """In a fresh interpreter: the test session's own runtimes must not share its cgroup."""
    need_bwrap()
    done = subprocess.run([sys.executable, "-c", CGROUP_SCRIPT, str(tmp_path), HOG],
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(done.stdout)
    if not seen["cgroup"]:
        pytest.fail("no writable memory cgroup on this machine; the budget test below covers "
                    "the fallback", pytrace=False)
    assert seen["capped"] == [False, ""]  # killed by the cap before it held 200 MiB
    assert seen["alone"] == [True, "held\n"]  # the cap, not the program, stopped it


async def test_without_a_cgroup_runs_wait_for_the_memory_budget(tmp_path):
    need_bwrap()
    budget = MemoryBudget(1024, use_cgroup=False, wait_s=0.5)
    box = Sandbox(limits=Limits(address_space_mb=1024, timeout_s=10), memory=budget)
    first = asyncio.create_task(box.run(["python3", "-c", "import time; time.sleep(2)"],
                                        Workspace(tmp_path / "a")))
    await asyncio.sleep(0.3)
    second = await box.run(["python3", "-c", "print(1)"], Workspace(tmp_path / "b"))
    assert not second.ok and "sandbox.total_memory_mb" in second.stderr
    assert (await first).ok and budget.reserved_mb == 0
    assert (await box.run(["python3", "-c", "print(1)"], Workspace(tmp_path / "b"))).ok


def test_usage_counts_the_tree_once_and_never_walks_through_a_link(tmp_path):
    """The quota's scan went by path: a folder swapped for a link sent it walking the host
    (issue 40). By descriptor, a link counts as itself, and a hard link once."""
    outside = tmp_path / "host"
    (outside / "big").mkdir(parents=True)
    (outside / "big" / "blob").write_bytes(b"x" * (4 << 20))
    root = tmp_path / "ws"
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "e" / "f").write_bytes(b"y" * (1 << 20))
    os.link(root / "d" / "e" / "f", root / "d" / "hard")
    os.symlink(outside, root / "d" / "link")
    used = usage_bytes(root)
    assert (1 << 20) <= used < (2 << 20)  # the 1 MiB file once; the 4 MiB outside never
    assert usage_bytes(tmp_path / "missing") == 0
