"""Stopping on evidence (trainer.stopping): held-out practice groups end the night, on a
tiny random Llama with the real SmolLM2 tokenizer, and the check's arithmetic alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer import train as T
from trainer.stopping import MIN_GROUPS, Stopper, mixed_groups, split



@pytest.fixture(scope="module", autouse=True)
def one_thread(one_torch_thread):
    return None


@pytest.fixture(scope="module")
def base_dir(tiny_base) -> Path:
    return tiny_base


def attempt(episode: int, task: int, answer: str, advantage: float) -> dict:
    return {"kind": "episode", "episode_id": episode, "split": "train", "tools": [],
            "messages": [{"role": "user", "content": f"Task {task}: reply yes or no."},
                         {"role": "assistant", "content": answer}],
            "advantages": [None, advantage], "token_overrides": [], "imitate": [],
            "labels": [], "group_baseline": True, "group": f"run-1:t{task}"}


def groups(tasks: range, passing: str, failing: str) -> list[dict]:
    """Each task's group: two attempts passed with ``passing``, two failed with ``failing``."""
    rows = []
    for task in tasks:
        base = 10 * task
        rows += [attempt(base + 1, task, passing, 1.0), attempt(base + 2, task, failing, -1.0),
                 attempt(base + 3, task, passing, 1.0), attempt(base + 4, task, failing, -1.0)]
    return rows


class Example:
    """What split and the margins read of a training sequence."""

    def __init__(self, group: str, episode: int, advantage: float):
        self.group, self.episode, self.terms = group, episode, 1
        self.adv = torch.tensor([advantage])


def test_split_holds_out_whole_mixed_groups_and_nothing_when_too_few():
    examples = [Example(f"g{g}", 10 * g + i, a) for g in range(10)
                for i, a in enumerate([1.0, -1.0, 1.0, -1.0])]
    examples += [Example("all-passed", 200 + i, 0.0) for i in range(4)]
    assert len(mixed_groups(examples)) == 10  # all-passed teaches nothing relative
    trained, held = split(examples, 0.3, seed=0)
    held_groups = {e.group for e in held}
    assert len(held_groups) == 3 and len(held) == 12
    assert not held_groups & {e.group for e in trained}
    assert split(examples, 0.3, seed=0)[1] == held  # seeded
    assert split(examples, 0.0, seed=0) == (examples, [])
    few = examples[:4 * (MIN_GROUPS - 1)]
    assert split(few, 0.5, seed=0) == (few, [])


def test_the_stopper_keeps_the_best_checks_weights_and_stops_after_its_patience():
    weight = torch.nn.Parameter(torch.zeros(2))
    margins = iter([0.10, 0.30, 0.29, 0.303, 0.20])  # +0.303 is not a gain of MIN_GAIN
    held = [Example("g", 1, 1.0), Example("g", 2, -1.0)]

    def measure(examples):
        m = next(margins)
        return [m / 2, -m / 2]

    stopper = Stopper(held, every=2, patience=3, measure=measure, trainable=[weight])
    stops = []
    for step in range(1, 11):
        with torch.no_grad():
            weight.fill_(step)
        if stopper.due(step):
            stops.append(stopper.score(step))
    assert stops == [False, False, False, False, True]
    assert [c["step"] for c in stopper.checks] == [2, 4, 6, 8, 10]
    assert stopper.restore(10) == 4 and weight.tolist() == [4.0, 4.0]
    assert "kept step 4's weights" in stopper.note(10, 16)
    assert "+0.300" in stopper.note(10, 16)


def test_held_out_groups_that_share_the_trained_rule_gain_and_do_not_stop_the_night(
        base_dir, tmp_path):
    rows = groups(range(8), "yes", "no")
    settings = T.Settings(steps=6, lr=1e-3, micro_batch=8, progress=False, stop_split=0.5,
                          stop_every=2, stop_patience=2)
    result = T.train(rows, base_dir, tmp_path, settings)
    assert [c["step"] for c in result.stop_checks] == [2, 4, 6]
    assert all(c["groups"] == 4 for c in result.stop_checks)
    margins = [c["margin"] for c in result.stop_checks]
    assert margins[0] > 0 and margins[-1] > margins[0]
    assert result.steps == 6 and result.stop_note == ""
    assert len(result.groups) == 4  # the trained half, measured as before


def test_held_out_groups_that_contradict_the_trained_rule_stop_the_night_early(
        base_dir, tmp_path):
    """The trained groups reward "yes", the held-out ones "no": every check loses, so the
    night stops after its patience and says no check gained."""
    rows = groups(range(4), "yes", "no") + groups(range(4, 8), "no", "yes")
    settings = T.Settings(steps=12, lr=1e-3, micro_batch=8, progress=False, stop_split=0.5,
                          stop_every=2, stop_patience=2, seed=68)
    trained, held = split(T.build_examples(rows, _tokenizer(base_dir), settings), 0.5, 68)
    assert {e.group for e in held} == {f"run-1:t{t}" for t in range(4, 8)}  # the seed's pick
    result = T.train(rows, base_dir, tmp_path, settings)
    assert [c["step"] for c in result.stop_checks] == [2, 4]
    assert all(c["margin"] < 0 for c in result.stop_checks)
    assert result.steps == 4 and result.planned_steps == 12
    assert "no check of 4 held-out practice groups gained" in result.stop_note
    assert "after 4 of 12 steps" in result.stop_note


def _tokenizer(base_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(base_dir))
