"""The evaluation gate's decision, checked by hand on small cases."""

from __future__ import annotations

from trainer.gate import Side, decide, eval_prompts, repetition


def side(eval_score=None, probe=None, open_score=0.5, degenerate=(False, False)):
    return Side(eval_score, probe, open_score, list(degenerate))


def test_a_candidate_better_by_the_margin_passes():
    report = decide(side(0.1, 0.5), side(0.3, 0.5), margin=0.05, regression_margin=0.5)
    assert report.passed and abs(report.gain - 0.2) < 1e-9


def test_a_candidate_not_better_by_the_margin_stays_a_candidate():
    report = decide(side(0.1, 0.5), side(0.12, 0.5), margin=0.05, regression_margin=0.5)
    assert not report.passed and "below the margin" in report.reasons[0]


def test_new_degenerate_repetition_is_a_regression_even_with_a_gain():
    report = decide(side(0.0), side(1.0, degenerate=(False, True)), 0.05, 0.5)
    assert not report.passed and "turned degenerate" in report.reasons[0]


def test_open_chat_falling_by_more_than_the_regression_margin_fails():
    report = decide(side(0.0, open_score=0.8), side(1.0, open_score=0.1), 0.05, 0.5)
    assert not report.passed and "open chat score fell" in report.reasons[0]


def test_no_evidence_means_no_promotion():
    report = decide(side(), side(), 0.0, 0.5)
    assert not report.passed and "no held-out prompt or probe" in report.reasons[0]


def test_repetition_measures_looping_text():
    assert repetition("the cat sat on the mat and looked at the dog") == 0.0
    assert repetition("go go go go " * 20) > 0.9


def test_eval_prompts_take_the_first_request_of_held_out_episodes():
    rows = [{"kind": "episode", "split": "eval", "messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]},
        {"kind": "episode", "split": "train", "messages": [{"role": "user", "content": "t"}]},
        {"kind": "value_prediction", "split": "train", "messages": []}]
    assert eval_prompts(rows, 10) == [[{"role": "system", "content": "s"},
                                       {"role": "user", "content": "q1"}]]
