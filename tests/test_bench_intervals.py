"""bench/intervals.py on planted before/after answers whose figure and interval are known."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from intervals import compare, figure  # noqa: E402


def test_every_item_gained_gives_plus_100_with_no_spread():
    days = [{"a": [(0.0, 1.0)] * 12}, {"a": [(0.0, 1.0)] * 7}]
    f = figure(days)
    assert (f.before, f.after, f.delta, f.lower, f.upper) == (0.0, 100.0, 100.0, 100.0, 100.0)
    assert (f.days, f.items) == (2, 19)


def test_pairing_cancels_what_both_sides_share():
    """Items that pass or fail alike before and after move nothing, whatever their mix:
    an unpaired comparison of 40 items at 50% would have an interval of +-18 pp."""
    items = [(1.0, 1.0)] * 20 + [(0.0, 0.0)] * 20
    f = figure([{"a": items}])
    assert (f.before, f.delta, f.lower, f.upper) == (50.0, 0.0, 0.0, 0.0)


def test_half_the_items_gaining_matches_the_normal_interval():
    """400 items, 200 gain one: delta 50 pp, standard error 50/sqrt(400) = 2.5 pp, so the
    90% interval is about 50 +- 1.645 * 2.5 = [45.9, 54.1]."""
    f = figure([{"a": [(0.0, 1.0)] * 200 + [(0.0, 0.0)] * 200}], resamples=4000)
    assert f.delta == 50.0
    assert 45.0 <= f.lower <= 47.0 and 53.0 <= f.upper <= 55.0


def test_days_are_resampled_so_a_day_that_did_not_move_widens_the_interval():
    """Day one gains 100 pp on every item, day two nothing: the items hold no spread, the
    days all of it. Two days drawn with replacement give 0, 50 or 100 (1/4, 1/2, 1/4),
    so the 90% interval is [0, 100] around 50."""
    days = [{"a": [(0.0, 1.0)] * 10}, {"a": [(1.0, 1.0)] * 10}]
    f = figure(days, resamples=4000)
    assert (f.delta, f.lower, f.upper) == (50.0, 0.0, 100.0)


def test_the_mean_row_weighs_families_alike_and_partial_scores_count_as_failed():
    days = [{"x": [(0.0, 1.0)] * 30, "y": [(0.5, 0.5)] * 5 + [(1.0, 0.5)] * 5}]
    assert figure(days, ["x"]).delta == 100.0
    y = figure(days, ["y"])
    assert (y.before, y.after, y.delta) == (50.0, 0.0, -50.0)  # 0.5 is not a pass
    mean = figure(days)
    assert mean.delta == 25.0 and mean.lower < 25.0 < mean.upper


def test_two_nights_on_one_day_are_compared_item_by_item():
    first = {"a": [1.0, 0.0, 0.0, 0.0]}
    second = {"a": [1.0, 1.0, 1.0, 0.0]}
    f = compare(first, second)
    assert (f.before, f.after, f.delta) == (25.0, 75.0, 50.0)
    assert 0.0 <= f.lower < 50.0 < f.upper <= 100.0  # diffs 0, 1, 1, 0: four draws
    with pytest.raises(ValueError, match="same day's items"):
        compare(first, {"a": [1.0]})


def test_a_day_missing_a_family_is_refused():
    with pytest.raises(ValueError, match="every family"):
        figure([{"a": [(0.0, 1.0)]}, {"a": []}], ["a"])
