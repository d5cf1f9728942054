"""What the sandbox costs: the round trip of a tiny Python program, with and without it.

Each figure is the median wall time, as the caller sees it, of ``python3 -c
'print(1)'`` run through ``Sandbox.run`` in a workspace:

- sandboxed: the real path (bwrap, the sandbox user when root, rlimits, caps);
- unsandboxed: the same runner with bwrap switched off (rlimits and caps only);
- bare: ``subprocess.run`` of the same interpreter, for the floor.

    .venv/bin/python bench/sandbox.py [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sandbox.paths import Workspace
from sandbox.process import Sandbox

PROGRAM = ["python3", "-c", "print(1)"]


async def runner_ms(box: Sandbox, ws: Workspace, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        result = await box.run(PROGRAM, ws)
        times.append((time.perf_counter() - started) * 1000)
        if not (result.ok and result.stdout == "1\n"):
            raise SystemExit(f"the program failed: {result}")
    return times


def bare_ms(runs: int) -> list[float]:
    python = str(Path(sys.base_prefix) / "bin" / "python3")
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([python, "-c", "print(1)"], capture_output=True, check=True)
        times.append((time.perf_counter() - started) * 1000)
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    sandboxed = Sandbox()
    if not sandboxed.sandboxed:
        raise SystemExit("bwrap 0.8+ is missing: apt-get install bubblewrap")
    unsandboxed = Sandbox(allow_unsandboxed=True)
    unsandboxed.bwrap = None  # the runner's own switch: as if bwrap were missing
    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace(Path(tmp) / "ws")
        await runner_ms(sandboxed, ws, 2)  # warm up: user setup, page cache
        rows = [
            ("sandboxed (bwrap)", await runner_ms(sandboxed, ws, args.runs)),
            ("unsandboxed (same runner)", await runner_ms(unsandboxed, ws, args.runs)),
            ("bare subprocess.run", bare_ms(args.runs)),
        ]
    print(f"python3 -c 'print(1)' round trip, median of {args.runs} runs")
    for name, times in rows:
        print(f"  {name:<27} {statistics.median(times):7.1f} ms"
              f"   (min {min(times):.1f}, max {max(times):.1f})")


if __name__ == "__main__":
    asyncio.run(main())
