"""Success reaching the weights (trainer.margins) and the night's time budget
(trainer.budget), on a tiny random Llama with the real SmolLM2 tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer import train as T
from trainer.budget import affordable_steps, estimated_steps, note

PROMPT = "What is 4 plus 6? Answer with only the number."


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_torch_thread):
    return None


@pytest.fixture(scope="module")
def base_dir(tiny_base) -> Path:
    return tiny_base


def attempt(episode: int, answer: str, advantage: float | None, group: str = "run-1:add") -> dict:
    """One practice attempt as trainer.night writes it: measured against its group."""
    return {"kind": "episode", "episode_id": episode, "split": "train", "tools": [],
            "messages": [{"role": "user", "content": PROMPT},
                         {"role": "assistant", "content": answer}],
            "advantages": [None, advantage], "token_overrides": [], "imitate": [],
            "labels": [], "group_baseline": True, "group": group}


def mixed_group() -> list[dict]:
    """Two attempts passed ("10"), two failed ("11"): rewards +1 and -1 about a mean of 0."""
    return [attempt(1, "10", 1.0), attempt(2, "11", -1.0), attempt(3, "10", 1.0),
            attempt(4, "11", -1.0)]


def demonstrations(n: int) -> list[dict]:
    """Other tasks no attempt passed: their references, imitated (no advantage)."""
    rows = []
    for i in range(n):
        row = attempt(100 + i, f"[WORD{i}] is the answer to this other task.", None, f"run-1:d{i}")
        row["messages"][0]["content"] = f"Reply with word {i} in brackets."
        row["imitate"], row["group_baseline"], row["group"] = [1], False, ""
        rows.append(row)
    return rows


def test_a_mixed_groups_passing_attempts_gain_log_probability_against_its_failing_ones(
        base_dir, tmp_path):
    settings = T.Settings(steps=6, lr=1e-3, micro_batch=4, progress=False)
    result = T.train(mixed_group(), base_dir, tmp_path, settings)
    (group,) = result.groups
    assert (group["group"], group["attempts"], group["passing"], group["failing"]) == \
        ("run-1:add", 4, 2, 2)
    assert group["adv_spread"] == 1.0 and (group["adv_min"], group["adv_max"]) == (-1.0, 1.0)
    assert group["pass_change"] > 0 > group["fail_change"]
    assert group["margin"] > 0.05  # nats per token, from 0 before the first update


def test_a_group_whose_attempts_all_passed_or_all_failed_is_not_measured(base_dir, tmp_path):
    rows = [attempt(1, "10", 0.0), attempt(2, "10", 0.0)]  # all passed: advantages 0
    rows += [{**r, "advantages": [None, 0.5]} for r in [attempt(3, "12", None, "other")]]
    settings = T.Settings(steps=1, micro_batch=4, progress=False)
    assert T.train(rows, base_dir, tmp_path, settings).groups == []


def test_demonstrations_beside_the_group_do_not_erase_its_margin(base_dir, tmp_path):
    """The diagnosis of a family that did not move: 12 references imitated beside one mixed
    group, in one batch, under the gradient clip. Imitation is length-normalised per
    sequence and weighs 1.0 a sequence; OAPL's pull is 2 * beta * A per message (0.2), so
    the demonstrations own most of the clipped gradient; the group must still gain."""
    settings = T.Settings(steps=6, lr=1e-3, micro_batch=4, progress=False)
    alone = T.train(mixed_group(), base_dir, tmp_path / "alone", settings).groups[0]
    beside = T.train(mixed_group() + demonstrations(12), base_dir, tmp_path / "beside",
                     settings).groups[0]
    assert beside["margin"] > 0
    assert beside["margin"] < alone["margin"]  # diluted: the share the clip leaves OAPL


def test_a_night_that_would_run_past_its_budget_trains_fewer_steps_and_says_so(
        base_dir, tmp_path):
    # An earlier night's tokens/s says one step takes about the whole budget: one step.
    settings = T.Settings(steps=8, micro_batch=4, progress=False, time_budget_s=3600.0,
                          expected_tokens_per_s=0.01)
    result = T.train(mixed_group(), base_dir, tmp_path / "a", settings)
    assert (result.steps, result.planned_steps) == (1, 8)
    assert "trained 1 of 8 planned steps" in result.budget_note
    # With no earlier measure, this night's own first step shows the budget is spent.
    settings = T.Settings(steps=8, micro_batch=4, progress=False, time_budget_s=1e-3)
    result = T.train(mixed_group(), base_dir, tmp_path / "b", settings)
    assert (result.steps, result.planned_steps) == (1, 8)
    assert "trained 1 of 8 planned steps" in result.budget_note
    assert "night.budget_s" in result.budget_note
    # Within its budget a night trains every planned step, and says nothing.
    settings = T.Settings(steps=3, micro_batch=4, progress=False, time_budget_s=3600.0)
    result = T.train(mixed_group(), base_dir, tmp_path / "c", settings)
    assert (result.steps, result.budget_note) == (3, "") and result.tokens_per_s > 0


def test_a_slow_first_step_does_not_cut_the_night_for_good(base_dir, tmp_path, monkeypatch):
    """After each step the budget is asked again for all the steps the night may take,
    not for what its last answer left, so a cut can be taken back once steps speed up;
    the learning rate follows the schedule fixed before the first step, never rising
    again after its warmup."""
    asked = []

    def budget(planned, done, elapsed_s, budget_s, step_s):
        asked.append(planned)
        return 2 if done == 1 else planned  # the first step looked slow, the rest did not

    monkeypatch.setattr(T, "affordable_steps", budget)
    settings = T.Settings(steps=6, micro_batch=4, progress=False, time_budget_s=3600.0,
                          schedule="cosine", warmup_steps=2)
    result = T.train(mixed_group(), base_dir, tmp_path / "a", settings)
    assert (result.steps, result.budget_note) == (6, "")
    assert asked == [6] * 6
    rates = [h["lr"] for h in result.history]
    peak = rates.index(max(rates))
    assert peak == 2 and rates[:peak] == sorted(rates[:peak])
    assert rates[peak:] == sorted(rates[peak:], reverse=True) and rates[-1] < rates[peak]


def test_the_budget_arithmetic():
    # 1,000 tokens a step at 100 tokens/s: 10 s a step; 45 s left gives 4 steps.
    assert estimated_steps(16, 1000, 100.0, 45.0) == 4
    assert estimated_steps(16, 1000, 100.0, -5.0) == 1  # never none
    assert estimated_steps(16, 1000, None, 45.0) == 16  # nothing measured yet
    assert estimated_steps(16, 1000, 100.0, None) == 16  # no budget
    # 3 steps done in 30 s of a 100 s budget at 10 s a step: 7 more, 10 in all.
    assert affordable_steps(16, 3, 30.0, 100.0, 10.0) == 10
    assert affordable_steps(16, 3, 130.0, 100.0, 10.0) == 3  # over: stop now
    assert affordable_steps(8, 3, 30.0, 100.0, 10.0) == 8  # never more than planned
    assert affordable_steps(8, 3, 30.0, None, 10.0) == 8
    # The note names the seconds kept for the margins' pass, where some were.
    assert note(3, 16, 500.0, 700.0) == (
        "trained 3 of 16 planned steps: at 500 tokens/s the rest would have run past the "
        "700 s the night's budget left for training (night.budget_s)")
    assert "700 s the night's budget left for training, 42 s of them kept for measuring" in (
        note(3, 16, 500.0, 700.0, 42.0))


def test_the_budget_keeps_time_for_the_margins_pass_over_the_mixed_groups_only(
        base_dir, tmp_path, monkeypatch):
    """After the loop only the mixed groups' attempts are read again (an all-alike group's
    anchor has OAPL terms too, and is not measured); the budget asked during the loop is
    the night's less MEASURE_SHARE of a step's time for each step's worth of them."""
    from trainer import margins

    anchor = attempt(9, "12", 0.0, "run-1:held")  # an all-failed group's anchor
    read = []
    real = margins.changes_under

    def counted(policy, examples, *args):
        read.append({e.episode for e in examples})
        return real(policy, examples, *args)

    budgets = []

    def budget(planned, done, elapsed_s, budget_s, step_s):
        budgets.append((budget_s, step_s))
        return planned

    monkeypatch.setattr(margins, "changes_under", counted)
    monkeypatch.setattr(T, "affordable_steps", budget)
    monkeypatch.setattr(T, "MEASURE_SHARE", 100.0)  # a reserve far above the timer's noise
    rows = mixed_group() + [anchor]
    settings = T.Settings(steps=2, batch=5, micro_batch=5, progress=False, time_budget_s=100.0)
    result = T.train(rows, base_dir, tmp_path, settings)
    assert read == [{1, 2, 3, 4}] and len(result.groups) == 1
    # 4 of the 5 sequences (all alike in length) are measured: 0.8 of a step's tokens.
    for budget_s, step_s in budgets:
        assert 100.0 - budget_s == pytest.approx(0.8 * step_s * 100.0, rel=0.05)
