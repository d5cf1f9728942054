"""bench/reliability.py runs in CI: one small category for real, and the exit status on a
failed probe (the suite must never hide one)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_undo_fuzz_category_runs_real_probes_and_prints_its_row():
    done = subprocess.run([sys.executable, str(ROOT / "bench/reliability.py"), "--quick",
                           "--only", "undo"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    row = re.search(r"^undo\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|", done.stdout, re.MULTILINE)
    assert row, done.stdout
    tried, failed = map(int, row.groups())
    assert tried >= 200 and failed == 0  # 6 sequences of 40 tool calls, each checked


def test_a_failed_probe_exits_non_zero_and_is_named_under_the_table(monkeypatch, capsys):
    from bench import reliability
    from bench.probes import Tally

    async def run(tally: Tally, work: Path, quick: bool) -> None:
        tally.check("a wall that holds", True)
        tally.check("a wall that gives way", False, "it fell")
        raise RuntimeError("and the category crashed")

    monkeypatch.setitem(sys.modules, "bench.probes.broken", types.SimpleNamespace(run=run))
    monkeypatch.setattr(reliability, "CATEGORIES", {"broken": "broken"})
    # In this process, as the category's own process runs it:
    monkeypatch.setattr(reliability, "in_child", lambda name, quick, verbose: asyncio.run(
        reliability.run_category(name, quick, verbose)))
    assert reliability.main(["--only", "broken"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^broken\s*\|\s*3\s*\|\s*2\s*\|", out, re.MULTILINE), out
    assert "FAILED broken: a wall that gives way: it fell" in out
    assert ("FAILED broken: broken (the category itself): RuntimeError: and the category "
            "crashed") in out


def test_a_category_whose_process_dies_is_a_failure(monkeypatch):
    from bench import reliability

    monkeypatch.setattr(reliability, "CATEGORIES", {"gone": "no_such_module"})
    tally, _ = reliability.in_child("gone", quick=True, verbose=False)
    assert tally.tried == 1 and "gone (the category's process)" in tally.failures[0]
