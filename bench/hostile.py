"""Hostile inputs to the parsing tools: time to a clear error, event-loop lag, peak memory.

Each case runs through the registry, as the agent calls it, in a fresh process, so its peak
memory (``ru_maxrss``) is the case's alone: "bot MB" is the process that called the tool,
"worker MB" the largest worker it started (tools.worker). "lag" is the longest the event loop
was late for a 10 ms ticker during the call. The limits are the tools' defaults.

- grep: ``(a+)+$`` on 30 "a"s and a "b" (in the bot's process: about a minute, loop frozen);
- outline: a 21 MB Python file (in-process: 67 s and 8.2 GiB) and a 1 MiB one (the cap);
- read_pdf: 10 pages made to stall pypdf (in-process: 5 s and 300 MB per page);
- view_image: a 315 KB ICO that decodes to 324 MB when opened.

Then the cost of the worker for ordinary calls: grep and outline medians.

    .venv/bin/python bench/hostile.py [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path[0] != str(ROOT):  # first, or bench/tools.py and bench/sandbox.py shadow the packages
    sys.path.insert(0, str(ROOT))

from sandbox.paths import Workspace  # noqa: E402
from tests.hostile_files import (  # noqa: E402
    CATASTROPHIC_PATTERN,
    catastrophic_line,
    ico_bomb,
    stalling_pdf,
    with_loop_lag,
)
from tools import ToolContext, default_registry  # noqa: E402

CASES = {
    "grep (a+)+$": ("a.txt", catastrophic_line(30).encode(), "grep", {"pattern": CATASTROPHIC_PATTERN}),
    "outline 21 MB .py": ("huge.py", None, "outline", {"path": "huge.py"}),
    "outline 1 MiB .py": ("cap.py", None, "outline", {"path": "cap.py"}),
    "read_pdf stalling": ("stall.pdf", None, "read_pdf", {"path": "stall.pdf"}),
    "view_image ICO bomb": ("bomb.ico", None, "view_image", {"path": "bomb.ico"}),
}


def _content(case: str) -> bytes:
    name, data, _, _ = CASES[case]
    if data is not None:
        return data
    if name == "huge.py":
        return b"x = [1, 2, 3]  # a line of a generated module\n" * 470_000
    if name == "cap.py":
        return b"def f(a, b):\n    return [a + b for _ in range(3)]\n" * 20_000  # 1,000,000 B
    if name == "stall.pdf":
        return stalling_pdf(pages=10)
    return ico_bomb(9000)


async def _run_case(case: str, base: Path) -> dict:
    name, _, tool, arguments = CASES[case]
    ctx = ToolContext.open("bench", Workspace(base / "ws"), base / "state",
                           image_cache=str(base / "images"))
    (ctx.workspace.root / name).write_bytes(_content(case))
    registry = default_registry()
    start = time.perf_counter()
    result, lag = await with_loop_lag(registry.call(tool, arguments, ctx))
    return {"case": case, "ok": result.ok, "seconds": time.perf_counter() - start, "lag": lag,
            "bot_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "output": result.output.splitlines()[0][:110]}


async def _ordinary(runs: int) -> tuple[list[float], list[float]]:
    registry = default_registry()
    with tempfile.TemporaryDirectory() as base:
        ctx = ToolContext.open("bench", Workspace(Path(base) / "ws"), Path(base) / "state")
        for i in range(50):
            (ctx.workspace.root / f"m{i}.py").write_text("def f(x):\n    return x  # TODO\n" * 40)
        greps, outlines = [], []
        for _ in range(runs):
            start = time.perf_counter()
            assert (await registry.call("grep", {"pattern": "TODO", "glob": "m1.py"}, ctx)).ok
            greps.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            assert (await registry.call("outline", {"path": "m1.py"}, ctx)).ok
            outlines.append((time.perf_counter() - start) * 1000)
    return greps, outlines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one case, in this fresh process
    args = parser.parse_args()
    if args.case:
        with tempfile.TemporaryDirectory() as base:
            print(json.dumps(asyncio.run(_run_case(args.case, Path(base)))))
        return
    print(f"{'case':<22}{'result':>9}{'seconds':>9}{'lag ms':>8}{'bot MB':>8}{'worker MB':>10}  message")
    worst_lag = 0.0
    for case in CASES:
        done = subprocess.run([sys.executable, __file__, "--case", case], capture_output=True,
                              text=True, timeout=300, check=True)
        r = json.loads(done.stdout)
        worst_lag = max(worst_lag, r["lag"])
        print(f"{case:<22}{'ok' if r['ok'] else 'refused':>9}{r['seconds']:>9.2f}"
              f"{r['lag'] * 1000:>8.1f}{r['bot_mb']:>8.0f}{r['worker_mb']:>10.0f}  {r['output']}")
    greps, outlines = asyncio.run(_ordinary(args.runs))
    print(f"worst event-loop lag over the cases: {worst_lag * 1000:.1f} ms")
    print(f"ordinary grep (one 80-line file) via the worker: median {statistics.median(greps):.0f} ms,"
          f" outline: median {statistics.median(outlines):.0f} ms (n={args.runs})")


if __name__ == "__main__":
    main()
