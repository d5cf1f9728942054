"""bench/learning.py's kept day: ``--keep`` copies the data folder as the practice left
it, and ``--day`` starts another night from that copy, untouched by the first night."""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # learning.py imports its sibling modules by name
spec = importlib.util.spec_from_file_location("bench_learning", ROOT / "bench/learning.py")
learning = importlib.util.module_from_spec(spec)
spec.loader.exec_module(learning)


def test_a_kept_day_is_restored_as_it_was_before_the_night(tmp_path):
    first = tmp_path / "first"
    (first / "data" / "workspaces").mkdir(parents=True)
    (first / "data" / "nightshift.db").write_bytes(b"the day's store")
    (first / "data" / "workspaces" / "a.txt").write_text("practice output")
    listener = socket.socket(socket.AF_UNIX)  # a socket left behind is not data to copy
    listener.bind(str(first / "data" / "s"))
    try:
        learning.save_day(first, {"before": {"protocol": [0.0, 1.0]}, "before_s": 12.0}, 99.5)
    finally:
        listener.close()
    assert not (first / "day" / "s").exists()
    (first / "data" / "nightshift.db").write_bytes(b"after the first night")

    second = tmp_path / "second"
    second.mkdir()
    result, since = learning.load_day(first, second)
    assert since == 99.5
    assert result == {"before": {"protocol": [0.0, 1.0]}, "before_s": 12.0, "after": {},
                      "day_from": str(first)}
    assert (second / "data" / "nightshift.db").read_bytes() == b"the day's store"
    assert (second / "data" / "workspaces" / "a.txt").read_text() == "practice output"


def test_a_folder_without_a_kept_day_is_refused_with_what_to_do(tmp_path):
    (tmp_path / "work").mkdir()
    with pytest.raises(SystemExit, match="--keep DIR first"):
        learning.load_day(tmp_path, tmp_path / "work")
    assert not os.listdir(tmp_path / "work")


def test_the_report_names_the_gates_outcome_and_its_open_chat_scores(capsys):
    """An inconclusive gate was printed as "refused"; a gate with no paired items has no gain."""
    gate = {"outcome": "inconclusive", "passed": False, "gain": 0.15,
            "reasons": ["it includes the margin +0.050"], "open_before": 0.59, "open_after": 0.68}
    result = {"before": {"protocol": [0.0, 0.0]}, "after": {"protocol": [1.0, 0.0]},
              "night": {"job": {"id": 4, "state": "done", "progress": {"gate": gate}}}}
    learning.report(result, 0.0)
    out = capsys.readouterr().out
    assert "protocol" in out and "+50.0" in out and "mean delta: +50.0 pp" in out
    assert "gate: inconclusive (gain +0.150); it includes the margin +0.050" in out
    assert "open chat (the gate's prompts, judged in [-1, 1]): +0.59 before, +0.68 after" in out
    learning.report({**result, "night": {"job": {"progress": {"gate": {
        "outcome": "inconclusive", "passed": False, "gain": None, "reasons": []}}}}}, 0.0)
    assert "gate: inconclusive (no paired items)" in capsys.readouterr().out


def test_a_run_whose_checks_need_the_missing_sandbox_is_refused_before_it_starts(
        monkeypatch, capsys):
    """Without bubblewrap every tool check comes back unjudged: a 15-minute run that can only
    report nothing learnt. The arithmetic and protocol families need no sandbox."""
    monkeypatch.setattr(learning, "find_bwrap", lambda: None)
    monkeypatch.setattr(learning, "find_gguf", lambda gguf: "model.gguf")
    monkeypatch.setattr(sys, "argv", ["learning.py", "--quick"])
    with pytest.raises(SystemExit):
        learning.main()
    assert "bubblewrap is missing" in capsys.readouterr().err
    started = []
    monkeypatch.setattr(learning, "run", lambda args, work: started.append(args.families))
    monkeypatch.setattr(learning, "report", lambda result, t: None)
    monkeypatch.setattr(learning.asyncio, "run", lambda value: value)
    monkeypatch.setattr(sys, "argv", ["learning.py", "--quick", "--families", "protocol"])
    learning.main()
    assert started == [["protocol"]]
