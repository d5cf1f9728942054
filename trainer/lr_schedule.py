"""The learning rate over a night's optimizer steps: a pure function of the step.

A night is a few Adam steps (16 by default) on a small, noisy set (a practice day's
references and attempts). At a constant rate the last steps move the weights as
far as the first, so the release is wherever the last noisy batch left it;
a decaying rate lets the early steps make the change and the late ones settle
it. A short warmup keeps Adam's first, poorly estimated steps small. On one kept
practice day (bench/learning.py --day) cosine with warmup 2 at the same peak
gained +21.7 pp against +18.3 for constant (config.example.toml has the runs).
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def check(schedule: str, warmup: int) -> None:
    """A clear error for a schedule or warmup the trainer cannot use."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: one of {', '.join(SCHEDULES)}")
    if warmup < 0:
        raise ValueError(f"warmup_steps is {warmup}: it must be 0 or more")


def lr_factor(update: int, steps: int, schedule: str = "constant", warmup: int = 0,
              floor: float = 0.1) -> float:
    """The share of the peak rate for optimizer update ``update`` (0-based) of ``steps``.

    ``warmup`` updates rise linearly to the peak; after them ``linear`` and ``cosine``
    fall to ``floor`` of it at the last update, and ``constant`` stays at the peak. A
    short night warms up for at most half its steps, so that it still decays; a night of
    one step trains at the peak."""
    check(schedule, warmup)
    if steps < 1 or not 0 <= update < steps:
        raise ValueError(f"update {update} is outside a night of {steps} steps")
    warmup = min(warmup, (steps - 1) // 2)
    if update < warmup:
        return (update + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    span = steps - 1 - warmup
    progress = (update - warmup) / span if span else 0.0  # one step after warmup: the peak
    if schedule == "linear":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
