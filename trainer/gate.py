"""The gate: is the candidate better than the model it would replace, per item, with
confidence, and no worse at open chat?

Both models answer greedily (temperature 0), in this process, through llama.cpp
(``llama_cpp.Llama``) on the same GGUF kind that is served, one model at a
time. What they answer and how it is scored: ``trainer.gate_items`` (held-out
practice items by their checks, the eval split by the judge, each rendered
with the agent's own system prompt and tools).

**Paired comparison.** Each item scored on both sides gives a difference
d = after − before in [−1, 1]. The gain is the mean of d, and its uncertainty
a paired bootstrap: ``bootstrap`` resamples of the items (seeded, so a night's
decision is reproducible) give an interval of the mean at ``confidence``
(two-sided; its lower end is a one-sided bound at (1 + confidence) / 2).

**Decision**, with its reasons:

- *reject*: open chat regressed (more answers degenerate than before, i.e.
  repeating themselves; about a fifth of the answers newly open
  with one shape, ``collapsed``; or the judged open-chat score fell by more than
  ``regression_margin``), or the whole interval lies below the margin;
- *inconclusive*: fewer than ``min_items`` items were scored on both sides, or
  the interval straddles the margin;
- *promote*: the interval's lower end is at least the margin, and no regression.

Only *promote* passes. A rejected or inconclusive night keeps its data for the
next night (``core.storage.ledger``'s ``next_night_since``).
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

from core.config import Config, NightConfig
from core.storage.store import Store
from trainer.client import JsonClient
from trainer.gate_checks import SandboxScorer
from trainer.gate_items import OPEN_PROMPTS, Item
from trainer.gate_side import Scorer, Side, asking_of, measure

CALL_LINE = re.compile(r"([A-Za-z_][\w.-]*) \{")  # a call, as reply_text writes it
PLAIN = re.compile(r"[a ]*[.!?]?")  # an opening of words alone: no format


_NIGHT = NightConfig()  # the gate's keys are [night]'s: their defaults are written there


@dataclass
class GateSettings:
    margin: float = _NIGHT.gate_margin  # the gain (score units of [0, 1] an item) to show
    regression_margin: float = _NIGHT.regression_margin
    min_items: int = _NIGHT.gate_min_items
    confidence: float = _NIGHT.gate_confidence
    bootstrap: int = 2000  # resamples of the paired bootstrap
    seed: int = _NIGHT.seed


@dataclass
class GateReport:
    outcome: str  # "promote" | "reject" | "inconclusive"
    reasons: list[str]
    n: int  # items scored on both sides
    gain: float | None  # mean paired difference
    lower: float | None
    upper: float | None
    items: dict[str, list]  # id -> [before, after]
    open_before: float | None = None
    open_after: float | None = None
    families: dict[str, dict] = field(default_factory=dict)  # family_scores
    # The open prompts that turned degenerate or collapsed, with both answers: what a
    # reader of the night needs to see (also when a loop only moved), and the gate keeps
    # no other copy of them.
    open_regressed: list[dict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.outcome == "promote"

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def opening(text: str) -> str:
    """The shape of an answer's first line: each run of letters folded to ``a``, of
    digits to ``9``, of spaces to one space, punctuation kept ("[RED]" and "[Français]"
    are both "[a]"); a first line that reads as a tool call (``reply_text``'s
    ``name {args}``) is its tool's name."""
    line = text.strip().split("\n", 1)[0].strip()
    if call := CALL_LINE.match(line):
        return f"{call[1]} {{...}}"
    return re.sub(r"\s+", " ", re.sub(r"\d+", "9", re.sub(r"[^\W\d_]+", "a", line)))


def collapsed(before: list[str], after: list[str]) -> tuple[str, list[int]] | None:
    """(shape, prompts) when about a fifth of the open prompts (4 of 22; at least 3)
    newly open with one shape: a practised format carried to prompts that never asked
    for it. The judge does not see it: 8 of 22 answers bracketed (6 opening "[a]"),
    judged +0.59 before and +0.57 after; 10 answered with tool calls (6 with write_file,
    2 of them before), judged +0.59 and +0.70. Words alone ("Red.", "a a a.") and empty
    answers are no format, and are left to the other checks."""
    newly: dict[str, list[int]] = {}
    for i, (old, new) in enumerate(zip(before, after)):
        shape = opening(new)
        if shape != opening(old) and not PLAIN.fullmatch(shape):
            newly.setdefault(shape, []).append(i)
    if not newly:
        return None
    shape, prompts = max(newly.items(), key=lambda kv: len(kv[1]))
    return (shape, prompts) if len(prompts) >= max(3, round(len(after) / 5)) else None


def paired_interval(diffs: list[float], settings: GateSettings) -> tuple[float, float, float]:
    """(mean, lower, upper) of the mean difference by a seeded paired bootstrap."""
    n = len(diffs)
    mean = sum(diffs) / n
    rng = random.Random(settings.seed)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n
                   for _ in range(settings.bootstrap))
    tail = (1 - settings.confidence) / 2
    lower = means[int(tail * (len(means) - 1))]
    upper = means[int((1 - tail) * (len(means) - 1))]
    return mean, lower, upper


def decide(before: Side, after: Side, settings: GateSettings,
           offered: int | None = None) -> GateReport:
    """The outcome; ``offered`` is how many items the gate had (held out and eval), so that
    too few paired items says whether the sets hold too few or their checks went unscored."""
    pairs = {k: [before.scores[k], after.scores.get(k)] for k in before.scores
             if before.scores[k] is not None and after.scores.get(k) is not None}
    diffs = [a - b for b, a in pairs.values()]
    report = GateReport("inconclusive", [], len(pairs), None, None, None, pairs,
                        before.open_score, after.open_score)
    regressions = _regressions(before, after, settings)
    report.open_regressed = _open_regressed(before, after)
    if diffs:
        report.gain, report.lower, report.upper = paired_interval(diffs, settings)
    interval = (f"gain {report.gain:+.3f}, {settings.confidence:.0%} interval "
                f"[{report.lower:+.3f}, {report.upper:+.3f}] on {len(diffs)} items"
                if diffs else "no item was scored before and after")
    if regressions:
        report.outcome, report.reasons = "reject", regressions
    elif len(diffs) < settings.min_items:
        report.reasons = [f"{interval}: {_too_few(len(diffs), offered, settings.min_items)}"]
    elif report.lower >= settings.margin:
        report.outcome = "promote"
        report.reasons = [f"{interval}: its lower end reaches the margin {settings.margin:+.3f}"]
    elif report.upper < settings.margin:
        report.outcome = "reject"
        report.reasons = [f"{interval}: it lies below the margin {settings.margin:+.3f}"]
    else:
        report.reasons = [f"{interval}: it includes the margin {settings.margin:+.3f}; more "
                          "held-out items would decide"]
    if not regressions and (moved := _newly_degenerate(before, after)):
        report.reasons.append(f"open chat: a loop moved to prompts {moved} "
                              f"({sum(after.degenerate)} of {len(after.degenerate)} answers "
                              f"loop, {sum(before.degenerate)} before)")
    return report


def _too_few(paired: int, offered: int | None, needed: int) -> str:
    offered = paired if offered is None else offered
    if offered < needed:
        return (f"too few items; the gate needs at least {needed} held-out items (practice "
                f"held-out items and eval-split episodes) and had {offered}: it needs "
                f"{needed - offered} more (add tasks to the practice sets, or raise "
                "practice.held_out_percent)")
    return (f"too few items; the gate needs at least {needed} scored before and after: "
            f"{offered} were held out, and {offered - paired} of them could not be scored on "
            "both sides (see below)")


def family_scores(items: list[Item], pairs: dict[str, list]) -> dict[str, dict]:
    """Family -> {n, before, after}: the mean score of its items scored on both sides."""
    grouped: dict[str, list[list]] = {}
    for item in items:
        if item.id in pairs:
            grouped.setdefault(item.family or "other", []).append(pairs[item.id])
    return {family: {"n": len(p), "before": round(sum(b for b, _ in p) / len(p), 4),
                     "after": round(sum(a for _, a in p) / len(p), 4)}
            for family, p in sorted(grouped.items())}


def _newly_degenerate(before: Side, after: Side) -> list[int]:
    return [i for i, (b, a) in enumerate(zip(before.degenerate, after.degenerate)) if a and not b]


def _newly_bad(before: Side, after: Side) -> list[int]:
    """Open prompts whose answer turned degenerate or fell into a collapsed shape."""
    shared = collapsed(before.open_answers, after.open_answers)
    return sorted(set(_newly_degenerate(before, after)) | set(shared[1] if shared else []))


def _open_regressed(before: Side, after: Side) -> list[dict]:
    def said(side: Side, i: int) -> str | None:
        return side.open_answers[i] if i < len(side.open_answers) else None
    return [{"prompt": i, "request": OPEN_PROMPTS[i] if i < len(OPEN_PROMPTS) else None,
             "before": said(before, i), "after": said(after, i)}
            for i in _newly_bad(before, after)]


def _regressions(before: Side, after: Side, settings: GateSettings) -> list[str]:
    reasons = []
    newly = _newly_degenerate(before, after)
    # Counted, not flipped: a small model loops on a few greedy answers, and any change of
    # weights moves which ones (the base model loops on one of the 22; three nights each
    # freed that one and looped on another). More loops than before is the regression.
    loops_before, loops_after = sum(before.degenerate), sum(after.degenerate)
    if loops_after > loops_before:
        example = after.open_answers[newly[0]] if newly and newly[0] < len(after.open_answers) \
            else ""
        shown = " ".join(example.split())
        shown = shown[:100] + ("..." if len(shown) > 100 else "")
        reasons.append(f"open chat regressed: prompts {newly} turned degenerate (repetition; "
                       f"{loops_after} of {len(after.degenerate)} answers loop, "
                       f"{loops_before} before)"
                       + (f', e.g. #{newly[0]}: "{shown}"' if shown else ""))
    shared = collapsed(before.open_answers, after.open_answers)
    if shared:
        shape, prompts = shared
        first = " ".join(after.open_answers[prompts[0]].split())[:60]
        reasons.append(f"open chat collapsed: {len(prompts)} of {len(after.open_answers)} "
                       f"answers newly open as {shape!r} (prompts {prompts}), e.g. "
                       f'#{prompts[0]}: "{first}"')
    if before.open_score is not None and after.open_score is not None \
            and after.open_score < before.open_score - settings.regression_margin:
        reasons.append(f"open chat regressed: its judged score fell from "
                       f"{before.open_score:.2f} to {after.open_score:.2f}")
    return reasons


def settings_of(config: Config) -> GateSettings:
    night = config.night
    return GateSettings(margin=night.gate_margin, regression_margin=night.regression_margin,
                        min_items=night.gate_min_items, confidence=night.gate_confidence,
                        seed=night.seed)


async def run_gate(config: Config, store: Store, rows: list[dict], args: dict,
                   before: tuple[Path, Path | None], after: tuple[Path, Path | None],
                   check: Callable[[], Awaitable[None]] | None = None,
                   scorer: Scorer | None = None, measured: Side | None = None) -> GateReport:
    """Evaluate ``before`` and ``after`` (gguf, lora) on the night's items and decide.

    ``args`` are the night job's inputs (``agent_view``, ``heldout``); ``rows`` its
    dataset (for the eval split); ``check`` runs between the two sides (cancellation).
    ``measured`` is ``before``'s side answered already (``measure_model``, before the
    night trained): it stands when it answered exactly these items, else ``before`` is
    asked again (a practice set changed its held-out items meanwhile).
    Checks are scored in the sandbox (``trainer.gate_checks``) unless ``scorer`` is given."""
    scorer = scorer or SandboxScorer(config)
    asking = await asking_of(config, store, rows, args)
    items = asking.items
    client = JsonClient.for_config(config)
    try:
        if measured is not None and set(measured.scores) == {i.id for i in items} \
                and len(measured.open_answers) == len(OPEN_PROMPTS):
            old = measured
        else:
            old = await measure(client, before, asking, scorer)
        if check is not None:
            await check()
        new = await measure(client, after, asking, scorer)
    finally:
        await client.close()
    report = decide(old, new, settings_of(config), len(items))
    report.families = family_scores(items, report.items)
    unscored = sum(1 for i in items if old.scores.get(i.id) is None
                   or new.scores.get(i.id) is None)
    if unscored:
        failures = [*old.failures, *new.failures]
        report.reasons.append(f"{unscored} of {len(items)} items could not be scored on both "
                              "sides and were left out"
                              + (f" (a check: {failures[0]})" if failures else ""))
    return report
