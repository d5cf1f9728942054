"""Practice sets: errors that name the line, each check kind (the sandboxed ones through
the real bwrap sandbox), unjudged crashing and looping checks, the held-out split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.practice.checks import judge
from core.practice.sets import (
    Check,
    PracticeSetError,
    Task,
    held_out_items,
    is_held_out,
    load_set,
)
from sandbox.paths import Workspace
from sandbox.process import Sandbox

ROOT = Path(__file__).resolve().parents[1]


def write_set(tmp_path: Path, *lines: object, name: str = "s.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n")
    return path


def task(i: int, check: dict | None = None) -> dict:
    return {"id": f"t{i}", "prompt": f"prompt {i}", "check": check or {"exact": str(i)}}


@pytest.mark.parametrize("bad, message", [
    ("{not json", r"s.jsonl:2: not valid JSON"),
    ('["a list"]', r"s.jsonl:2: a task must be a JSON object"),
    ({"id": "x", "prompt": "p"}, r"s.jsonl:2: .*missing: \['check'\]"),
    ({"id": "x", "prompt": "p", "check": {"exact": "1"}, "extra": 1}, r"unknown: \['extra'\]"),
    ({"id": "", "prompt": "p", "check": {"exact": "1"}}, r"s.jsonl:2: id must be a non-empty"),
    ({"id": "x", "prompt": " ", "check": {"exact": "1"}}, r"s.jsonl:2: prompt must be"),
    ({"id": "x", "prompt": "p", "check": {"fuzzy": "1"}}, r"s.jsonl:2: check must be one of"),
    ({"id": "x", "prompt": "p", "check": {"exact": "1", "regex": "1"}}, r"check must be one of"),
    ({"id": "x", "prompt": "p", "check": {"regex": "(unclosed"}}, r"s.jsonl:2: the regex .* "
                                                                  r"does not compile"),
    ({"id": "t0", "prompt": "p", "check": {"exact": "1"}}, r"s.jsonl:2: the id 't0' is already "
                                                           r"used on line 1"),
    ({"id": "x", "prompt": "p", "check": {"python": "missing.py"}}, r"s.jsonl:2: cannot read the "
                                                                    r"python check"),
    ({"id": "x", "prompt": "p", "check": {"exact": "1"}, "reference": {"calls": []}},
     r"s.jsonl:2: a reference with tool calls is"),
    ({"id": "x", "prompt": "p", "check": {"exact": "1"},
      "reference": {"calls": [{"name": "write_file"}], "answer": "ok"}},
     r"s.jsonl:2: reference call 1 must be"),
    ({"id": "x", "prompt": "p", "check": {"exact": "1"},
      "reference": {"calls": [{"name": "f", "arguments": {}}] * 9, "answer": "ok"}},
     r"with 1 to 8 calls"),
])
def test_a_bad_line_is_refused_with_its_line_number_and_the_fix(tmp_path, bad, message):
    path = write_set(tmp_path, task(0), bad)
    with pytest.raises(PracticeSetError, match=message):
        load_set(path)


def test_a_reference_can_show_the_tool_calls_that_do_the_task(tmp_path):
    line = {"id": "x", "prompt": "Write hi to a.txt", "check": {"exact": "done"},
            "reference": {"calls": [{"name": "write_file",
                                     "arguments": {"path": "a.txt", "content": "hi"}}],
                          "answer": " I wrote a.txt. "}}
    only = load_set(write_set(tmp_path, line)).tasks[0]
    assert only.reference == "I wrote a.txt."
    assert only.calls == (("write_file", {"path": "a.txt", "content": "hi"}),)


def test_a_python_check_must_be_python_that_defines_reward(tmp_path):
    (tmp_path / "broken.py").write_text("def reward(:\n")
    (tmp_path / "noreward.py").write_text("def score(answer, workspace):\n    return 1\n")
    with pytest.raises(PracticeSetError, match=r"s.jsonl:1: .*broken.py is not valid Python"):
        load_set(write_set(tmp_path, task(0, {"python": "broken.py"})))
    with pytest.raises(PracticeSetError, match=r"s.jsonl:1: .*must define\s+reward"):
        load_set(write_set(tmp_path, task(0, {"python": "noreward.py"})))


def test_an_empty_or_missing_set_is_refused(tmp_path):
    with pytest.raises(PracticeSetError, match="has no tasks"):
        load_set(write_set(tmp_path, ""))
    with pytest.raises(PracticeSetError, match="cannot read the practice set"):
        load_set(tmp_path / "nope.jsonl")


def test_the_example_set_loads_with_all_three_check_kinds():
    pset = load_set(ROOT / "examples/arithmetic.jsonl")
    assert pset.name == "arithmetic"
    assert {t.check.kind for t in pset.tasks} == {"exact", "regex", "python"}
    python = next(t for t in pset.tasks if t.check.kind == "python")
    assert "def reward" in python.check.code
    assert python.calls == (("write_file", {"path": "answer.txt", "content": "42"}),)


def test_the_held_out_split_depends_on_the_task_id_alone(tmp_path):
    ids = [f"task-{i}" for i in range(400)]
    held = {i for i in ids if is_held_out(i, 20)}
    assert 50 <= len(held) <= 110  # about 20%: a hash, not a count
    forward = write_set(tmp_path, *[{"id": i, "prompt": "p", "check": {"exact": "1"}}
                                    for i in ids], name="a.jsonl")
    # Reordered, grown and renamed: every held-out task stays held out.
    grown = ["new-1", *reversed(ids), "new-2"]
    other = write_set(tmp_path, *[{"id": i, "prompt": "p", "check": {"exact": "1"}}
                                  for i in grown], name="renamed.jsonl")
    assert {t.id for t in held_out_items(forward)} == held
    assert held <= {t.id for t in held_out_items(other)}
    practised, held_tasks = load_set(forward).split(20)
    assert not {t.id for t in practised} & {t.id for t in held_tasks}
    assert len(practised) + len(held_tasks) == len(ids)
    assert load_set(forward).split(0)[1] == []


# -- the checks ---------------------------------------------------------------------


def make_task(kind: str, value: str, code: str = "") -> Task:
    return Task("t", "p", Check(kind, value, code), 1)


@pytest.fixture
def space(tmp_path) -> tuple[Workspace, Sandbox]:
    root = tmp_path / "ws"
    root.mkdir()
    return Workspace(root), Sandbox()


async def test_exact_compares_the_stripped_answer(space):
    workspace, sandbox = space
    assert (await judge(make_task("exact", "42"), " 42\n", workspace, sandbox)).reward == 1.0
    assert (await judge(make_task("exact", "42"), "42.", workspace, sandbox)).reward == 0.0
    assert (await judge(make_task("exact", "42"), "The answer is 42", workspace,
                        sandbox)).reward == 0.0


async def test_regex_matches_the_whole_answer_in_the_sandbox(space):
    workspace, sandbox = space
    assert sandbox.sandboxed, "bubblewrap is needed for the sandboxed checks"
    assert (await judge(make_task("regex", r"\d+"), "17", workspace, sandbox)).reward == 1.0
    assert (await judge(make_task("regex", r"\d+"), "17 apples", workspace, sandbox)).reward == 0.0


async def test_a_catastrophic_regex_times_out_and_leaves_the_attempt_unjudged(space):
    workspace, sandbox = space
    verdict = await judge(make_task("regex", r"(a+)+$"), "a" * 40 + "b", workspace, sandbox,
                          timeout_s=1)
    assert verdict.reward is None and "timed out" in verdict.why


CHECK = """
from pathlib import Path
def reward(answer, workspace):
    made = (Path(workspace) / "out.txt").read_text().strip()
    return 1.0 if made == answer else 0.25
"""


async def test_python_check_reads_the_workspace_and_returns_its_reward(space):
    workspace, sandbox = space
    (workspace.root / "out.txt").write_text("hello\n")
    task_ = make_task("python", "/sets/check.py", CHECK)
    assert (await judge(task_, "hello", workspace, sandbox)).reward == 1.0
    assert (await judge(task_, "bye", workspace, sandbox)).reward == 0.25


@pytest.mark.parametrize("body, why", [
    ("raise RuntimeError('boom')", r"crashed .*RuntimeError: boom"),
    ("while True: pass", r"timed out after 1 s"),
    ("return 'yes'", r"returned str, not a number"),
    ("return True", r"returned bool, not a number"),
    ("return 1.5", r"returned 1.5, not a number in \[0, 1\]"),
    ("return float('nan')", r"returned nan"),
    ("import os; os._exit(0)", r"reported no result"),
    ("print('@@practice-0000000000000000@@ {\"value\": 1.0}'); return None",
     r"returned NoneType"),
])
async def test_a_crashing_looping_or_garbage_check_leaves_the_attempt_unjudged(space, body, why):
    workspace, sandbox = space
    code = f"def reward(answer, workspace):\n    {body}\n"
    verdict = await judge(make_task("python", "/sets/check.py", code), "x", workspace, sandbox,
                          timeout_s=1)
    assert verdict.reward is None and not verdict.judged
    assert __import__("re").search(why, verdict.why), verdict.why


async def test_a_file_the_agent_left_in_the_workspace_cannot_shadow_the_checks_imports(space):
    workspace, sandbox = space
    (workspace.root / "json.py").write_text("raise SystemExit('shadowed')\n")
    (workspace.root / "re.py").write_text("raise SystemExit('shadowed')\n")
    assert (await judge(make_task("regex", "ok"), "ok", workspace, sandbox)).reward == 1.0
