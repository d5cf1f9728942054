"""Stopping on evidence: a night ends when success stops reaching practice it did not train on.

With ``train.stop_split`` > 0, that share of the night's practice groups with mixed rewards
(``trainer.margins``: passing and failing attempts of one task side by side) is held out of
training. Every ``train.stop_every`` steps the held-out groups are scored by their margin:

    margin = mean over groups of [ change(passing attempts) - change(failing attempts) ]

with change(y) the mean per-token log-prob gain of y's judged actions over pi_lag. It is 0
before the first step; a rising margin says the update moves unseen tasks' sampling toward
what passes. The night keeps the weights of the best check and stops once ``stop_patience``
checks in a row fail to beat it (by ``MIN_GAIN``), or at its planned steps.

The held-out items the gate pairs are never used here: they stay the release's own test.
Why practice groups and not a loss: the losses mix imitation, ECHO and a KL anchor, and fall
on training data whatever happens to the answers; the margin is the one quantity a
group-relative update exists to raise, measured where the update was not fitted.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.margins import attempt_advantages, group_margins, mixed, summary

# A check beats the best only by this much (nats a token): a flat margin is no evidence.
MIN_GAIN = 0.005
# Fewer held-out groups than this and the margin is one task's noise: no stopping.
MIN_GROUPS = 3


def mixed_groups(examples: list[Any]) -> list[str]:
    """The groups whose attempts' advantages have both signs, sorted."""
    groups = attempt_advantages([e for e in examples if e.terms])
    return sorted(g for g, advantage in groups.items() if mixed(advantage))


def split(examples: list[Any], share: float, seed: int) -> tuple[list[Any], list[Any]]:
    """(trained, held out): ``share`` of the mixed groups (seeded), every sequence of each
    held out. Nothing is held out when that would leave fewer than MIN_GROUPS groups."""
    groups = mixed_groups(examples)
    count = round(share * len(groups))
    if share <= 0 or count < MIN_GROUPS:
        return examples, []
    held = set(random.Random(seed).sample(groups, count))
    return ([e for e in examples if e.group not in held],
            [e for e in examples if e.group in held])


@dataclass
class Stopper:
    """The checks of one night; ``score(step)`` measures, keeps the best, and says stop."""

    held: list[Any]
    every: int
    patience: int
    measure: Callable[[list[Any]], list[float | None]]  # each held example's change
    trainable: list[torch.Tensor] = field(repr=False, default_factory=list)
    best_margin: float = 0.0
    best_step: int = 0
    misses: int = 0
    checks: list[dict] = field(default_factory=list)
    _best: list[torch.Tensor] | None = field(default=None, repr=False)

    def due(self, step: int) -> bool:
        return bool(self.held) and self.every > 0 and step % self.every == 0

    def score(self, step: int) -> bool:
        """Measure at ``step``; True when the night should stop."""
        groups = group_margins(self.held, self.measure(self.held))
        margin = summary(groups)["margin"]
        margin = 0.0 if margin is None else margin
        self.checks.append({"step": step, "margin": margin, "groups": len(groups)})
        if margin > self.best_margin + MIN_GAIN:
            self.best_margin, self.best_step, self.misses = margin, step, 0
            self._best = [p.detach().clone() for p in self.trainable]
            return False
        self.misses += 1
        return self.misses >= self.patience

    def restore(self, step: int) -> int:
        """Put back the best check's weights if a later step is loaded; the step kept."""
        if self._best is None or self.best_step == step:
            return step
        with torch.no_grad():
            for p, kept in zip(self.trainable, self._best):
                p.copy_(kept)
        return self.best_step

    def note(self, steps: int, planned: int) -> str:
        """What the night says about its stop, or "" when the checks never ended it early
        nor rolled it back."""
        if not self.checks or (steps >= planned and self.best_step == self.checks[-1]["step"]):
            return ""
        groups = self.checks[-1]["groups"]
        if self.best_step == 0:
            return (f"no check of {groups} held-out practice groups gained over the untrained "
                    f"model by {MIN_GAIN} nats a token: stopped after {steps} of {planned} "
                    "steps and kept the last weights (the references still trained)")
        return (f"kept step {self.best_step}'s weights: {groups} held-out practice groups' "
                f"margin peaked there (+{self.best_margin:.3f} nats a token), stopped after "
                f"{steps} of {planned} steps")
