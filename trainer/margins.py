"""Does success reach the weights? Per practice group with mixed rewards.

A practice group is the G attempts of one task in one run (``trainer.rewards``); with
mixed rewards it holds passing and failing attempts of one prompt side by side, the
signal a group-relative loss exists for. For each such group the night logs:

- the spread of its attempts' advantages (population standard deviation, and the
  range): how hard OAPL is asked to pull the attempts apart (a message's log-ratio
  target is A / beta nats);
- after training, the change in log-probability of its passing attempts against its
  failing ones:

      change(y) = mean over y's action tokens of [ log pi_theta(y_t) - log pi_lag(y_t) ]
      margin    = mean change of passing attempts - mean change of failing attempts

  in nats per token. It is 0 before the first update (pi_theta starts at pi_lag), so a
  positive margin is success reaching the weights; a margin at 0 (or below) says the
  group's signal did not, whatever the held-out figure did.

Passing and failing are by reward against the group's mean (the sign of the attempt's
advantage). A demonstration (imitated, no advantage) is in neither side; an attempt
imitated because it passed (``night.imitate_passing``) is on the passing side. Sequences are
counted per view (a row under a tool list gives two), attempts per episode.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from trainer.examples import collate, oapl_reads
from trainer.policy import micro_batches, shared_prefix


def changes(examples: list[Any], after: list[torch.Tensor]) -> list[float | None]:
    """Each example's mean per-token change of log-prob at its judged action tokens
    (``after`` and ``e.lag`` as (T,) log-probs); None for one with no judged token."""
    out = []
    for e, logp in zip(examples, after):
        actions = e.msg >= 0  # (T,)
        if not bool(actions.any()) or e.lag is None:
            out.append(None)
            continue
        out.append(float((logp[actions] - e.lag[actions]).mean()))
    return out


def _attempt(e: Any) -> bool:
    """A practice attempt with an advantage. A demonstration has none (imitated only); a
    passing attempt imitated beside OAPL (night.imitate_passing) has one, and counts."""
    return bool(getattr(e, "group", "")) and len(e.adv) > 0


def attempt_advantages(examples: list[Any]) -> dict[str, dict[Any, float]]:
    """Per practice group, each attempt's advantage (the mean over its messages), by
    episode (``_attempt`` says which examples count)."""
    out: dict[str, dict[Any, float]] = defaultdict(dict)
    for e in examples:
        if _attempt(e):
            out[e.group].setdefault(e.episode, float(e.adv.float().mean()))
    return out


def mixed(advantages: dict[Any, float]) -> bool:
    """Passing and failing attempts side by side: advantages of both signs."""
    return min(advantages.values()) < 0 < max(advantages.values())


def group_margins(examples: list[Any], change: list[float | None]) -> list[dict]:
    """One entry per group with mixed rewards: attempts, passing, failing, the spread
    and range of their advantages, the passing and failing changes and their margin."""
    grouped: dict[str, list[tuple[Any, float | None]]] = defaultdict(list)
    for e, c in zip(examples, change):
        if _attempt(e):
            grouped[e.group].append((e, c))
    out = []
    for group, advantage in sorted(attempt_advantages(examples).items()):
        if not mixed(advantage):
            continue  # nothing relative to learn
        members = grouped[group]
        values = list(advantage.values())
        passing = [c for e, c in members if advantage[e.episode] > 0 and c is not None]
        failing = [c for e, c in members if advantage[e.episode] < 0 and c is not None]
        mean = sum(values) / len(values)
        spread = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        entry = {"group": group, "attempts": len(values),
                 "passing": sum(v > 0 for v in values), "failing": sum(v < 0 for v in values),
                 "adv_spread": round(spread, 4), "adv_min": round(min(values), 4),
                 "adv_max": round(max(values), 4),
                 "pass_change": _rounded_mean(passing), "fail_change": _rounded_mean(failing)}
        entry["margin"] = (None if entry["pass_change"] is None or entry["fail_change"] is None
                           else round(entry["pass_change"] - entry["fail_change"], 4))
        out.append(entry)
    return out


def summary(groups: list[dict]) -> dict:
    """The night's figures over its mixed groups, for the report."""
    margins = [g["margin"] for g in groups if g["margin"] is not None]
    return {"groups": len(groups),
            "adv_spread": _rounded_mean([g["adv_spread"] for g in groups]),
            "pass_change": _rounded_mean([g["pass_change"] for g in groups
                                          if g["pass_change"] is not None]),
            "fail_change": _rounded_mean([g["fail_change"] for g in groups
                                          if g["fail_change"] is not None]),
            "margin": _rounded_mean(margins), "gained": sum(m > 0 for m in margins)}


def _rounded_mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


@torch.no_grad()
def changes_under(policy: Any, examples: list[Any], micro_batch: int, micro_tokens: int,
                  pad_id: int, device: torch.device, shares: bool) -> list[float | None]:
    """``changes`` with ``policy`` as it is now: each example's log-probs at its judged
    actions against its ``lag`` (which must be set)."""
    found: dict[int, torch.Tensor] = {}
    for micro in micro_batches(examples, micro_batch, micro_tokens, shares):
        batch = collate(micro, pad_id)
        logp = policy(batch["ids"].to(device), shared_prefix(micro),
                      oapl_reads(batch).to(device)).float().cpu()  # (B, T)
        for row, e in enumerate(micro):
            found[id(e)] = logp[row, :len(e.ids)]
    return changes(examples, [found[id(e)] for e in examples])


def in_mixed_groups(examples: list[Any]) -> list[Any]:
    """The attempts of the groups with mixed rewards: all that ``measure`` reads. An
    all-alike group's anchor has OAPL terms too, and a forward pass over it is wasted."""
    advantages = attempt_advantages(examples)
    return [e for e in examples
            if _attempt(e) and e.terms and mixed(advantages[e.group])]


def measure(policy: Any, examples: list[Any], micro_batch: int, micro_tokens: int,
            pad_id: int, device: torch.device, shares: bool) -> list[dict]:
    """The night's mixed groups, measured with ``policy`` as trained: ``examples`` are
    ``in_mixed_groups``' (any others cost a forward pass, and ``group_margins`` drops them)."""
    return group_margins(examples, changes_under(policy, examples, micro_batch, micro_tokens,
                                                 pad_id, device, shares))
