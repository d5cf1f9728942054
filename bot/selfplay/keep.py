"""Self-play's growing practice set: the tasks it invented and found middling.

A task is kept when its solvers' mean reward was strictly between 0 and 1 and
within ``selfplay.keep_band`` of the target: a task every solver solves, or
none does, teaches nothing relative. It is appended to
``<data_dir>/practice/selfplay.jsonl`` in the practice-set format, a python
check as its own file under ``<data_dir>/practice/selfplay/`` (named by the
task's id, which is a hash of its content, so a task found twice is kept
once). The file is an ordinary practice set: ``/practice`` can run it.

Its held-out share is the practice one (``practice.held_out_percent``, by a
hash of the id) and is published where the gate reads held-out items, by the
practice runner's own ``publish_held_out``; a python check travels there with
its code, and the gate runs it in the sandbox (``trainer.gate_checks``): the
model wrote it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bot.practice.runner import publish_held_out
from bot.selfplay.proposal import Proposal
from core.practice.sets import load_set

SET_NAME = "selfplay"


def is_middling(mean: float | None, target: float, band: float) -> bool:
    return mean is not None and 0.0 < mean < 1.0 and abs(mean - target) <= band


def set_path(data_dir: Path) -> Path:
    return data_dir / "practice" / f"{SET_NAME}.jsonl"


def in_set(data_dir: Path, task_id: str) -> bool:
    """Whether the growing set holds the task. Blocking: call it in a thread."""
    path = set_path(data_dir)
    return path.is_file() and any(t.id == task_id for t in load_set(path).tasks)


def keep_task(data_dir: Path, proposal: Proposal, held_out_percent: int) -> bool:
    """Append ``proposal`` to the growing set and republish its held-out items.
    False when the set already holds it. Blocking: call it in a thread."""
    path = set_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    if in_set(data_dir, proposal.id):
        return False
    if proposal.check.kind == "python":
        check_file = path.parent / proposal.set_check()["python"]
        check_file.parent.mkdir(parents=True, exist_ok=True)
        _write(check_file, proposal.check.code)
    line = json.dumps({"id": proposal.id, "prompt": proposal.prompt,
                       "check": proposal.set_check()})
    with path.open("a", encoding="utf-8") as out:
        out.write(line + "\n")
    _, held = load_set(path).split(held_out_percent)
    publish_held_out(data_dir / "heldout", SET_NAME, held)
    return True


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
