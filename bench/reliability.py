"""The reliability suite: real attacks and crashes against the real parts, counted.

Prints ``category | tried | failed | seconds`` and exits non-zero when any probe failed,
naming each failure under the table. It runs probes, not pytest: each category drives the
real component (bwrap sandbox, SQLite store, llama.cpp server, trainer, Discord front end
on dpytest, console) with hostile input, and checks the outcome from outside.

- sandbox: programs through ``run_python`` and file-tool calls that try to leave the
  workspace (host files, /proc, network, writes outside, symlinks, fork bomb, memory, disk);
- leaks: 50 channels, each with a secret in its files, notes, history and jobs; every other
  channel looks for them through its tools and its model context;
- undo: random file edits, undo, redo and outside changes against a model of the state;
- kill-log: kill -9 of a process writing trajectories to the store (>= 50 kills);
- kill-train: kill -9 of a tiny model's LoRA training mid-step, then the rerun;
- wedged: SIGSTOP of the real llama.cpp server, and a server that accepts and never answers;
- candidate: a corrupt release GGUF (refused, the old model keeps serving), a failed gate;
- admin: a non-admin calls every admin command through Discord (slash and !sleep), the
  console and DMs;
- hostile: the hostile inputs of issue 11 (parts 1-3) and a few more.
- races: a real background job swaps folders for links while the bot clears scratch,
  measures usage, walks for git_add and hands the workspace over; a host canary stays.
- complexity: glob with 40 `**`, recipe format-spec bombs, six host calls that never
  return, the day's growth (history tags, episode counts); the loop's stalls measured.
- release-kill: kill -9 of a process writing releases (folder, hashes, the store's row
  with the gate's decision): nothing torn or gate-failed is ever what promote takes.
- forget: /forget against a running turn (mid-tool, mid-reply, the next turn compacting
  it), a running night (before and after it trains, /promote, its held memory) and after a
  kill -9 mid-turn; a planted string is found only where the README says.
- quota: attachments against a small quota, the undo journal's, the image cache's and the
  notes' growth against their bounds, the data folder under its budget after every write
  (one person's channels under their share), judged practice workspaces reclaimed.

    .venv/bin/python bench/reliability.py [--quick] [--only CATEGORY ...]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path[0] != str(ROOT):  # first, or bench/tools.py and bench/sandbox.py shadow the packages
    sys.path.insert(0, str(ROOT))

from bench.probes import Tally  # noqa: E402

CATEGORIES = {  # name -> module under bench/probes
    "sandbox": "sandbox_escape",
    "leaks": "leaks",
    "undo": "undo_fuzz",
    "kill-log": "kill_log",
    "kill-train": "kill_train",
    "wedged": "wedged",
    "candidate": "candidate",
    "admin": "admin",
    "hostile": "hostile",
    "races": "races",
    "complexity": "complexity",
    "release-kill": "release_kill",
    "forget": "forget",
    "quota": "quota",
}


async def run_category(name: str, quick: bool, verbose: bool = False) -> tuple[Tally, float]:
    module = importlib.import_module(f"bench.probes.{CATEGORIES[name]}")
    tally = Tally(verbose=verbose)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"reliability-{name}-") as work:
        try:
            await module.run(tally, Path(work), quick)
        except Exception as exc:  # noqa: BLE001 - a category that crashed is a failure, shown
            tally.check(f"{name} (the category itself)", False, f"{type(exc).__name__}: {exc}")
    return tally, time.perf_counter() - start


def in_child(name: str, quick: bool, verbose: bool) -> tuple[Tally, float]:
    """Run one category in its own process: a crash (or a leaked server, or dpytest's global
    state) stays there, and its memory figures are its own. Started through a shell that
    forks it, since a process exec'd straight from this one would inherit this process's
    peak RSS as its own ru_maxrss (Linux keeps it over exec)."""
    argv = [sys.executable, __file__, "--child", name] + ["--quick"] * quick + ["-v"] * verbose
    start = time.perf_counter()
    done = subprocess.run(["/bin/sh", "-c", '"$@"; exit $?', "sh", *argv], cwd=ROOT,
                          stdout=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    lines = done.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tally = Tally()
        tally.check(f"{name} (the category's process)", False,
                    f"exit {done.returncode} without a report: {done.stdout[-300:]!r}")
        return tally, seconds
    return Tally(report["tried"], report["failures"], report["notes"]), report["seconds"]


def table(rows: list[tuple[str, Tally, float]]) -> str:
    lines = [f"{'category':<12}| {'tried':>5} | {'failed':>6} | {'seconds':>7}",
             f"{'-' * 12}|{'-' * 7}|{'-' * 8}|{'-' * 8}"]
    for name, tally, seconds in rows:
        lines.append(f"{name:<12}| {tally.tried:>5} | {len(tally.failures):>6} | {seconds:>7.1f}")
    tried = sum(t.tried for _, t, _ in rows)
    failed = sum(len(t.failures) for _, t, _ in rows)
    lines.append(f"{'total':<12}| {tried:>5} | {failed:>6} | {sum(s for *_, s in rows):>7.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--only", action="append", choices=list(CATEGORIES), metavar="CATEGORY",
                        help=f"run only this category (repeatable): {', '.join(CATEGORIES)}")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every probe's verdict")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one category, in this process
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)  # the probes provoke errors the bot logs
    if args.child:
        tally, seconds = asyncio.run(run_category(args.child, args.quick, args.verbose))
        print(json.dumps({"tried": tally.tried, "failures": tally.failures,
                          "notes": tally.notes, "seconds": seconds}))
        return 0
    rows = []
    for name in args.only or CATEGORIES:
        tally, seconds = in_child(name, args.quick, args.verbose)
        rows.append((name, tally, seconds))
        print(f"{name}: {tally.tried} tried, {len(tally.failures)} failed, {seconds:.1f} s",
              file=sys.stderr, flush=True)
    print(table(rows))
    for name, tally, _ in rows:
        for note in tally.notes:
            print(f"{name}: {note}")
    for name, tally, _ in rows:
        for failure in tally.failures:
            print(f"FAILED {name}: {failure}")
    return 1 if any(t.failures for _, t, _ in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
