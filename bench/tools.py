"""How long the file tools take through the registry, journal included.

An edit is ``edit_file`` (replace_text) on a 200-line file: argument checks,
a worker thread, the jail, the before/after snapshots with their blobs, the
file write and the journal entry plus head, each a temp file and
``os.replace``. A read is ``read_file`` of its first 100 lines. An undo
reverts one such edit. Median and 95th percentile over ``--runs`` calls.

    .venv/bin/python bench/tools.py [--runs 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sandbox.paths import Workspace  # noqa: E402
from tools import ToolContext, default_registry  # noqa: E402


async def _timed(registry, name: str, arguments: dict, ctx: ToolContext) -> float:
    start = time.perf_counter()
    result = await registry.call(name, arguments, ctx)
    elapsed = (time.perf_counter() - start) * 1000
    if not result.ok:
        raise SystemExit(f"{name} failed: {result.output}")
    return elapsed


def _report(label: str, times: list[float]) -> None:
    times = sorted(times)
    p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
    print(f"{label:<44} median {statistics.median(times):7.3f} ms   p95 {p95:7.3f} ms   (n={len(times)})")


async def main(runs: int) -> None:
    registry = default_registry()
    with tempfile.TemporaryDirectory() as base:
        ctx = ToolContext.open("bench", Workspace(Path(base) / "ws"), Path(base) / "state")
        lines = [f"line {i}: some ordinary text of a source file\n" for i in range(200)]
        (ctx.workspace.root / "notes.txt").write_text("".join(lines))
        edits, reads, undos = [], [], []
        for i in range(runs):
            edits.append(await _timed(registry, "edit_file", {
                "path": "notes.txt", "mode": "replace_text",
                "old": lines[100].rstrip("\n") if i == 0 else f"edit {i - 1}", "new": f"edit {i}"}, ctx))
        for _ in range(runs):
            reads.append(await _timed(registry, "read_file", {"path": "notes.txt"}, ctx))
        for _ in range(runs):
            undos.append(await _timed(registry, "undo", {}, ctx))
    searches, sandboxed = await _notes_and_python(registry, min(runs, 50))
    print(f"tools bench: {runs} runs each, 200-line file ({sum(map(len, lines))} bytes)")
    _report("edit_file (replace_text) + journal entry", edits)
    _report("read_file (100 lines)", reads)
    _report("undo (one edit)", undos)
    _report("note_search (200 notes, k=5)", searches)
    _report("run_python print(1), sandboxed, journaled", sandboxed)


async def _notes_and_python(registry, runs: int) -> tuple[list[float], list[float]]:
    from core.storage.embedder import MiniLMEmbedder
    from sandbox.process import Sandbox
    from tools.notes import NoteStore

    with tempfile.TemporaryDirectory() as base:
        notes = NoteStore(Path(base) / "notes", MiniLMEmbedder())
        ctx = ToolContext.open("bench", Workspace(Path(base) / "ws"), Path(base) / "state",
                               notes=notes, sandbox=Sandbox())
        topics = ["rivers", "tea", "compilers", "owls", "granite", "jazz", "orbits", "bread"]
        for i in range(200):
            notes.add("bench", f"note {i} about {topics[i % 8]} and item {i * 7 % 13}", f"n{i}")
        searches = [await _timed(registry, "note_search", {"query": f"{topics[i % 8]} facts"}, ctx)
                    for i in range(runs)]
        runs_py = [await _timed(registry, "run_python", {"code": "print(1)"}, ctx)
                   for _ in range(min(runs, 20))]
    return searches, runs_py


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    asyncio.run(main(parser.parse_args().runs))
