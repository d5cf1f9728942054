"""Reward sources, in order of precedence: ``verifier`` > ``person`` > ``judge``.

Every sub-task's reward records where it came from (``SubTask.source``, and
``SubTask.check`` for which check or label):

1. ``verifier``: a check that ran. The bot's practice runner (or self-play)
   stores it as an event; the step limit is a built-in check (below).
2. ``person``: the latest ``accepted``/``verified`` (+1) or ``rejected`` (-1)
   label of the episode. Who may label is the bot's business; the store keeps
   labels in order, and the last one of these three wins.
3. ``judge``: the LLM judge (``trainer.judge``), for everything else.

A verifier or person reward covers one episode, as one sub-task from its
first message to its final answer (the last assistant message that is not the
harness's probe): every assistant message of the episode takes its advantage,
and no judge sub-task or understanding score applies inside it. The judge
still reads those episodes, blind, and ``agreement`` reports how often it
agrees with the people (and the checks): the measure of how far to trust it.

**The verifier contract** (what a practice runner writes; ``core.storage.events``)::

    result = CheckResult(check="regex", reward=0.75, task="arith-17", group="run-3:arith-17")
    await store.add_event(channel_id, episode_id, Event.VERIFIER_REWARD, result.payload())

``reward`` is a number in [0, 1] (1 = passed), or None when the check failed to run
(``error`` says why); ``check`` is required; the G attempts of one task in one run
share a ``group``.

- The reward in [0, 1] becomes ``2 * reward - 1`` in [-1, 1].
- The latest event of an episode (highest id) wins.
- A null, non-numeric or out-of-range reward, or no ``check``, leaves the
  episode unjudged: collect excludes it as ``check-failed`` (unless a person
  labelled it), never scored 0 or 1 by accident.
- Attempts sharing a ``group`` (two or more in the night) are measured
  against the group's mean reward and length instead of the value model's
  prediction: same task, same night, so the mean is the better baseline
  (``task_advantages``). Their advantages are then zero-mean per group, and
  the night's centring leaves them as they are (``trainer.advantages.centre``).
- ``"check": "reference"`` marks a demonstration (a practice task's reference
  answer): it is imitated, and it is neither baselined nor in its group's mean.

**A loop fails.** A check sees an attempt's outcome, not its text: a
``write_file`` whose content repeats one sentence to the token limit is "the
right file, the wrong content" and would rise above peers that wrote nothing.
An episode with a check's reward whose agent message loops (``trainer.loops``,
the gate's own measure) gets ``night.aborted_reward`` instead, its check
marked ``looped`` (``SubTask.looped``), so no night teaches the repetition the gate rejects
(the judge's agreement with checks reads that held-down reward). A
demonstration is never held down.

**The step limit.** An episode the agent did not finish (status ``aborted``:
the step limit, or too many malformed tool calls) is a failure to learn
from: without a check's reward or a label it gets ``night.aborted_reward``
(-1) as a ``verifier`` reward with check ``step-limit``, and the turn penalty
as any episode. It ranks below a stored check and a person's label.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from core.config import NightConfig
from core.storage.events import REFERENCE
from core.storage.store import Episode
from trainer.judge import Message, SubTask, turns_used
from trainer.loops import loops, reply_text

PERSON_REWARDS = {"accepted": 1.0, "verified": 1.0, "rejected": -1.0}
STEP_LIMIT = "step-limit"
_DESCRIPTION_CHARS = 300


@dataclass
class VerifierReward:
    """One episode's stored check result; ``reward`` is in [-1, 1], None when unjudged."""

    reward: float | None
    check: str
    group: str = ""
    task: str = ""
    error: str = ""


def read_verifier_event(payload: dict) -> VerifierReward:
    """The event's payload as a reward, or an unjudged result saying what is wrong."""
    check = payload.get("check") if isinstance(payload, dict) else None
    if not isinstance(check, str) or not check:
        return VerifierReward(None, "", error="the event names no check")
    group, task = str(payload.get("group") or ""), str(payload.get("task") or "")
    reward = payload.get("reward")
    if reward is None:
        error = str(payload.get("error") or "the check gave no reward")
        return VerifierReward(None, check, group, task, error)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) \
            or not math.isfinite(reward) or not 0 <= reward <= 1:
        return VerifierReward(None, check, group, task, f"reward {reward!r} is not a number in [0, 1]")
    return VerifierReward(2 * float(reward) - 1, check, group, task)


def verifier_rewards(events: list[dict]) -> dict[int, VerifierReward]:
    """Episode id -> its latest verifier event, read."""
    out = {}
    for event in sorted(events, key=lambda e: e["id"]):
        if event.get("episode_id") is not None:
            out[event["episode_id"]] = read_verifier_event(event["payload"])
    return out


def person_reward(labels: list[str]) -> float | None:
    """+1 / -1 from the latest accepted, verified or rejected label, else None."""
    for label in reversed(labels):
        if label in PERSON_REWARDS:
            return PERSON_REWARDS[label]
    return None


def episode_span(day: list[Message], episode_id: int) -> tuple[int, int] | None:
    """(first message, final answer) of an episode in its channel's day."""
    mine = [m for m in day if m.episode_id == episode_id]
    answers = [m for m in mine if m.role == "assistant" and not m.harness]
    return (mine[0].index, answers[-1].index) if answers else None


def episode_subtask(episode: Episode, day: list[Message], verified: VerifierReward | None,
                    settings: NightConfig) -> SubTask | None:
    """The reward that outranks the judge for this episode, as a sub-task, or None."""
    if verified is not None and verified.reward is not None:
        source, check, reward, group = "verifier", verified.check, verified.reward, verified.group
    elif (person := person_reward(episode.labels)) is not None:
        source, check, reward, group = "person", "label", person, ""
    elif episode.status == "aborted":
        source, check, reward, group = "verifier", STEP_LIMIT, settings.aborted_reward, ""
    else:
        return None
    span = episode_span(day, episode.id)
    if span is None:
        return None
    start, end = span
    held = False
    if source == "verifier" and check != REFERENCE and reward > settings.aborted_reward \
            and looped(day[start:end + 1]):
        reward, held = settings.aborted_reward, True
    request = next((m.content for m in day[start:end + 1] if m.role == "user" and not m.harness), "")
    description = " ".join(request.split())[:_DESCRIPTION_CHARS] or f"episode {episode.id}"
    return SubTask(episode.channel_id, start, end, description, reward, turns_used(day, start, end),
                   source=source, key=f"{episode.channel_id}:episode:{episode.id}", check=check,
                   group=group, looped=held)


def looped(messages: list[Message]) -> bool:
    """Whether one of the agent's messages loops (``trainer.loops``)."""
    return any(loops(m.content) or loops(reply_text({"tool_calls": m.tool_calls}))
               for m in messages if m.role == "assistant" and not m.harness)


def overridden(subtask: SubTask, day: list[Message], ruled: set[int]) -> bool:
    """A judge sub-task all of whose agent messages lie in episodes a higher source rules."""
    agents = [m for m in day[subtask.start:subtask.end + 1]
              if m.role == "assistant" and not m.harness]
    return bool(agents) and all(m.episode_id in ruled for m in agents)


def agreement(judged: list[SubTask], ruling: dict[int, SubTask], days: dict[str, list[Message]],
              people: dict[int, float]) -> dict:
    """How often the blind judge agrees with people's labels and with checks.

    The judge's verdict on an episode is the mean reward of its sub-tasks that
    overlap the episode; it agrees when the verdict has the label's sign (a
    verdict of 0 does not). Episodes the judge left uncovered are counted apart.
    """
    verdicts = _verdicts([s for s in judged if s.source == "judge"], days)
    checks = {e: s.reward for e, s in ruling.items() if s.source == "verifier" and s.reward != 0}
    return {"person": _agree(people, verdicts), "verifier": _agree(checks, verdicts)}


def _verdicts(judged: list[SubTask], days: dict[str, list[Message]]) -> dict[int, float]:
    rewards: dict[int, list[float]] = defaultdict(list)
    for s in judged:
        for episode_id in {m.episode_id for m in days[s.channel][s.start:s.end + 1]}:
            rewards[episode_id].append(s.reward)
    return {e: sum(r) / len(r) for e, r in rewards.items()}


def _agree(truth: dict[int, float], verdicts: dict[int, float]) -> dict:
    covered = [e for e in truth if e in verdicts]
    agree = sum(1 for e in covered if verdicts[e] * truth[e] > 0)
    return {"n": len(covered), "agree": agree,
            "percent": round(100 * agree / len(covered), 1) if covered else None,
            "uncovered": len(truth) - len(covered)}


def reward_stats(subtasks: list[SubTask]) -> dict[str, dict]:
    """Source -> {n, mean, spread}: the night's rewards by where they came from (the
    spread is the population standard deviation), for the night report."""
    by_source: dict[str, list[float]] = defaultdict(list)
    for s in subtasks:
        by_source[s.source].append(s.reward)
    out = {}
    for source, rewards in sorted(by_source.items()):
        mean = sum(rewards) / len(rewards)
        spread = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        out[source] = {"n": len(rewards), "mean": round(mean, 4), "spread": round(spread, 4)}
    return out


def group_relative(subtasks: list[SubTask]) -> dict[str, list[SubTask]]:
    """Group -> its sampled attempts tonight, where there are two or more: their mean is
    their baseline. A demonstration (check ``reference``) is not one of them: it was not
    sampled from the model, and it is imitated (``trainer.advantages``), not baselined."""
    groups: dict[str, list[SubTask]] = defaultdict(list)
    for s in subtasks:
        if s.group and s.check != REFERENCE:
            groups[s.group].append(s)
    return {g: peers for g, peers in groups.items() if len(peers) >= 2}


def task_advantages(subtasks: list[SubTask], predictions: dict, settings: NightConfig
                    ) -> dict[str, float]:
    """Sub-task key -> A_task = (r - r_base) + length_weight * -(len - len_base) / length_scale.

    The base is the group's mean for practice attempts of one task (two or more
    tonight), else the value model's prediction; no base, no advantage. In a group
    whose attempts all scored alike nothing is better than the rest: its first
    attempt is held where it is (advantage 0: OAPL's term is then its KL to pi_lag
    alone) and the others get none. Pushed down whole, a failed group also pushes
    down what its attempts did right (a practice night that did so turned the
    embedded model from answering sums in words, right but wordy, to calling
    read_file on them). Left free, it let the imitated references of one family
    teach their format to every prompt: 8 of the gate's 22 open-chat prompts were
    answered in the protocol family's brackets; with one attempt a group held, none
    were (bench/learning.py, one kept day; README "Measuring it"). One attempt, not
    all: each held row costs a pi_lag pass, and holding all four of a group cost
    256 s more training and lost the tool family. A demonstration has no advantage:
    it is imitated, not trained by OAPL. With ``night.anchor_demonstrated`` off, a group
    shown by its reference holds none: its anchor holds the very answer the reference
    replaces (an arithmetic task's "28 + 15 = 33" against "43").
    """
    groups = group_relative(subtasks)
    shown = {s.group for s in subtasks if s.check == REFERENCE and s.group}
    out = {}
    for s in subtasks:
        if s.check == REFERENCE:
            continue
        peers = groups.get(s.group, [])  # "" (no group) is never a key
        if peers:
            if len({p.reward for p in peers}) == 1:
                if s is peers[0] and (settings.anchor_demonstrated or s.group not in shown):
                    out[s.key] = 0.0  # the group's anchor: OAPL's KL term alone holds it
                continue
            base_reward = sum(p.reward for p in peers) / len(peers)
            base_length = sum(p.length for p in peers) / len(peers)
        elif s.key in predictions:
            base_reward, base_length = predictions[s.key].reward, predictions[s.key].length
        else:
            continue
        length_adv = -(s.length - base_length) / settings.length_scale
        out[s.key] = (s.reward - base_reward) + settings.length_weight * length_adv
    return out
