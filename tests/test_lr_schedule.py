"""The learning rate over a night's steps (trainer.lr_schedule); tests/test_train.py checks
that training uses it."""

import math
from typing import get_args

import pytest

from core.config.learning import TrainConfig
from trainer.lr_schedule import SCHEDULES, lr_factor


def test_warmup_rises_to_the_peak_then_constant_stays_there():
    factors = [lr_factor(k, 8, "constant", warmup=3) for k in range(8)]
    assert factors[:3] == [0.25, 0.5, 0.75]
    assert factors[3:] == [1.0] * 5


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_a_decaying_schedule_falls_from_the_peak_to_the_floor(schedule):
    factors = [lr_factor(k, 16, schedule, warmup=2, floor=0.1) for k in range(16)]
    assert factors[2] == 1.0
    assert math.isclose(factors[-1], 0.1)
    after = factors[2:]
    assert all(a > b for a, b in zip(after, after[1:]))


def test_cosine_is_halfway_at_the_middle_of_its_decay():
    assert math.isclose(lr_factor(5, 11, "cosine", warmup=0, floor=0.0), 0.5)


def test_a_night_of_one_step_trains_at_the_peak_whatever_the_schedule():
    assert lr_factor(0, 1, "cosine", warmup=4) == 1.0
    assert lr_factor(0, 1, "linear", warmup=0) == 1.0


def test_a_short_night_warms_up_for_at_most_half_its_steps_and_still_decays():
    assert [lr_factor(k, 3, "cosine", warmup=2) for k in range(3)] == pytest.approx(
        [0.5, 1.0, 0.1])
    assert [lr_factor(k, 2, "linear", warmup=5) for k in range(2)] == pytest.approx([1.0, 0.1])


def test_the_config_offers_the_schedules_the_trainer_knows():
    assert get_args(TrainConfig.model_fields["schedule"].annotation) == SCHEDULES


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown schedule 'step'"):
        lr_factor(0, 4, "step")
    with pytest.raises(ValueError, match="warmup_steps is -3: it must be 0 or more"):
        lr_factor(0, 4, "cosine", warmup=-3)
    with pytest.raises(ValueError, match="outside a night of 4 steps"):
        lr_factor(4, 4, "cosine")
