"""bench/learning.py's task families: deterministic, disjoint, and valid practice sets
whose checks pass the right answer and fail a wrong one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from core.practice.checks import judge
from core.practice.sets import load_set
from sandbox.paths import Workspace
from sandbox.process import Sandbox

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_families", ROOT / "bench/families.py")
families = importlib.util.module_from_spec(spec)
spec.loader.exec_module(families)


@pytest.mark.parametrize("family", list(families.FAMILIES))
def test_train_and_held_out_items_are_disjoint_and_the_same_for_the_same_seed(family):
    train, held = families.items(family, 16, 20, seed=0)
    assert len(train) == 16 and len(held) == 20
    assert not {t["prompt"] for t in train} & {t["prompt"] for t in held}
    assert (train, held) == families.items(family, 16, 20, seed=0)
    assert (train, held) != families.items(family, 16, 20, seed=1)


def test_a_family_too_small_for_the_train_split_keeps_its_held_out_items_whole(monkeypatch):
    monkeypatch.setitem(families.FAMILIES, "tiny", lambda rng: {
        "id": f"tiny-{rng.randint(1, 5)}", "prompt": "?", "check": {"exact": "1"}})
    train, held = families.items("tiny", 16, 3)
    assert len(held) == 3 and len(train) == 2
    assert not {t["id"] for t in train} & {t["id"] for t in held}
    with pytest.raises(ValueError, match="5 distinct items: too few for 5 held out"):
        families.items("tiny", 16, 5)


async def test_the_tool_family_checks_the_workspace_in_the_sandbox(tmp_path):
    train, _ = families.items("tool", 12, 0)
    pset = load_set(families.write_set(tmp_path / "sets", "tool", train))
    assert {t.check.kind for t in pset.tasks} == {"python"}
    sandbox = Sandbox()
    for i, task in enumerate(pset.tasks[:4]):
        root = tmp_path / f"ws{i}"
        root.mkdir()
        workspace = Workspace(root)
        assert (await judge(task, "done", workspace, sandbox)).reward == 0.0
        item = train[i]
        if item["id"].startswith("tool-dir-"):
            (root / item["id"].removeprefix("tool-dir-")).mkdir()
        else:
            _, _, word, other = item["id"].split("-")
            (root / f"{word}.txt").write_text(other + "\n")
        assert (await judge(task, "done", workspace, sandbox)).reward == 1.0


async def test_the_last_family_passes_the_last_word_named_first_in_any_words(tmp_path):
    train, _ = families.items("last", 3, 0)
    pset = load_set(families.write_set(tmp_path / "sets", "last", train))
    sandbox = Sandbox()
    task, words = pset.tasks[0], train[0]["id"].split("-")[1:]
    workspace = Workspace(tmp_path / "ws")
    answers = {f'The word "{words[3]}" comes last in the list.': 1.0,
               f"{words[3].upper()}, not {words[0]}": 1.0,
               f"{words[0]} comes before {words[3]}": 0.0,  # the first one named counts
               "The word kooky comes last.": 0.0}
    for answer, reward in answers.items():
        assert (await judge(task, answer, workspace, sandbox)).reward == reward, answer
