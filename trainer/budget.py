"""The night's time budget, as training steps: a night that would run past
``night.budget_s`` trains fewer steps, and says so.

The night gives training the seconds its budget leaves (``trainer.sleep``): the budget
less the time already spent and what the export and the gate's second side will take
(``reserved``; the night measures the gate's first side, the live model, before it
trains, so that side's seconds are known then). Before
the first step, a tokens/s measured on an earlier night (same machine) estimates a
step's time from its tokens: the most steps the night may take, and the length of its
learning-rate schedule. After each step, this night's own mean step time decides how
many of those it takes, asked afresh each time, so slow early steps do not cut the
night for good (the first steps also pay for pi_lag's pass, so it errs towards fewer
steps). Pure arithmetic: ``trainer.train`` and ``trainer.sleep`` call it.
"""

from __future__ import annotations


def estimated_steps(planned: int, tokens_per_step: float, tokens_per_s: float | None,
                    seconds_left: float | None) -> int:
    """Steps that fit ``seconds_left`` at ``tokens_per_s`` (at least 1, at most planned)."""
    if not tokens_per_s or seconds_left is None or tokens_per_step <= 0:
        return planned
    step_s = tokens_per_step / tokens_per_s
    return max(1, min(planned, int(max(0.0, seconds_left) // step_s)))


def affordable_steps(planned: int, done: int, elapsed_s: float, budget_s: float | None,
                     step_s: float) -> int:
    """The total steps a training may take after ``done`` steps in ``elapsed_s`` of its
    ``budget_s``, each taking ``step_s``: never fewer than done, never more than planned."""
    if budget_s is None or step_s <= 0:
        return planned
    more = int(max(0.0, budget_s - elapsed_s) // step_s)
    return max(done, min(planned, done + more))


def note(trained: int, planned: int, tokens_per_s: float, budget_s: float,
         reserved_s: float = 0.0) -> str:
    """What the night says when the budget cut its training: ``reserved_s`` of the budget
    were kept for the pass after the steps (``trainer.margins``)."""
    kept = (f", {reserved_s:.0f} s of them kept for measuring the practice groups after the "
            "steps" if reserved_s >= 0.5 else "")
    return (f"trained {trained} of {planned} planned steps: at {tokens_per_s:,.0f} tokens/s "
            f"the rest would have run past the {budget_s:.0f} s the night's budget left "
            f"for training{kept} (night.budget_s)")


# The candidate's side of the gate takes longer than the live model's measured one: a
# night that taught tool calls adds rounds (the gate asks again after each call), and an
# adapter release applies its LoRA at every token.
CANDIDATE_SIDE = 1.3
EXPORT_SHARE = 0.05  # of the budget, for an export before any night has timed one
FIRST_RESERVE = 0.25  # of the budget, when the live side was not measured


def reserved(budget_s: float, live_side_s: float | None, last_export_s: float | None) -> float:
    """Seconds the training leaves for what follows it: the export (as long as the last
    one took, ``EXPORT_SHARE`` of the budget before any) and the gate's candidate side
    (``CANDIDATE_SIDE`` times the live side); ``FIRST_RESERVE`` of the budget for both
    where the live side was not measured."""
    if live_side_s is None:
        return FIRST_RESERVE * budget_s
    export = EXPORT_SHARE * budget_s if last_export_s is None else last_export_s
    return export + CANDIDATE_SIDE * live_side_s


def resumed_clock(progress: dict, now: float) -> dict:
    """A resumed night's budget and stage times count the time it ran, not the time it lay
    stopped (``updated``: its last write before it stopped)."""
    gap = now - progress.get("updated", now)
    return {**progress, **{k: progress[k] + gap for k in ("started_at", "stage_entered")
                           if k in progress}}
