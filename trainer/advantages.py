"""Advantages: the night's numbers per assistant message, and the training rows.

For each sub-task with a baseline (``trainer.rewards.task_advantages``):

    A_task = (r - r_base) + length_weight * ( -(len - len_base) / length_scale )

Every assistant message inside the sub-task's range gets A_task (the mean, if
several sub-tasks cover it). In an episode whose reward came from a check or a
person, only that episode's sub-task counts: judge sub-tasks and the
understanding score do not reach its messages. In an episode sampled for the
understanding pass, a message's advantage is the mean of A_task and the
understanding advantage (or the latter alone where no sub-task covers the
message). The turn-count penalty then takes ``turn_penalty`` per assistant
message beyond the first in the episode.

Then the night's advantages are centred: the mean over the train split's
judged messages is subtracted from every message (``centre``). OAPL regresses
beta * log-ratio onto A per message, so a non-zero mean would push every
sampled answer up (or down) alike, whatever its quality; centred, the night
only moves answers relative to each other. Per message, not per episode,
because the loss sums over messages. Practice attempts measured against their
group's mean (``trainer.rewards.task_advantages``; the row's ``group_baseline``)
are already relative, zero-mean per group, and are neither counted nor
shifted: counted per message, a group's long failed attempts (a tool loop of
seven calls beside a one-message success) would outweigh its successes and
shift every message of the night.

A stray end-of-turn (the agent answered "no" to "Did you mean to end your
turn?") puts ``stray_advantage`` on that message's last token as a token-level
override (not centred: it is a fixed penalty on one token). The probe itself
(its question, the agent's JSON answer, the go-ahead: steps with
``meta.probe``) is harness text: listed in the row's ``harness`` so that
``trainer.tokens`` neither trains nor observes it. Messages with no advantage
are left out of OAPL.

A demonstration (a practice task's reference, recorded because no attempt
passed: ``meta.demonstration``) is listed in the row's ``imitate`` and trained
by likelihood (``trainer.losses.imitation_loss``), not by OAPL: it was not
sampled from the served model. It has no advantage, and its failed attempts
none either (a group that all failed has nothing relative in it), except the
first, held at advantage 0 (``trainer.rewards.task_advantages``) so that the
reference does not carry its format to other prompts: the night learns the task
from the reference alone. Under a tool list it is imitated in both of its views
(``trainer.tokens``): the tools view's action is only the choices to answer in
words (``message:``, then the end rather than a call's head), the plain view's
is the words, and by default (``train.imitation_per = "sequence"``) each
sequence's loss is normalised by its own length, so the choices weigh as much as
the answer. That was intended: the embedded model, offered tools, called one for
"What is 3 times 9?". Per token, a tool demonstration's call weighs as much as
those choices do. A reference's first choice that most of its group's attempts made too
is not imitated (``train.imitate_known_choices``, off by default: ``trainer.examples``):
imitated, the arithmetic and protocol references' choice to answer in words, which their
attempts made anyway, taught the tool prompts to answer in words on two of three kept days.
"""

from __future__ import annotations

from collections import defaultdict

from core.config import NightConfig
from core.storage.store import Episode
from trainer.judge import Message, SubTask


def message_advantages(day: list[Message], subtasks: list[SubTask],
                       task_advantage: dict[str, float],
                       ruled: dict[int, str] | None = None) -> dict[int, list[float]]:
    """Step id -> the task advantages of the sub-tasks covering that assistant message.

    ``ruled`` maps an episode to the key of the sub-task that outranks the judge
    there: only that sub-task reaches the episode's messages.
    """
    ruled = ruled or {}
    out: dict[int, list[float]] = defaultdict(list)
    for subtask in subtasks:
        if subtask.key not in task_advantage:
            continue  # no baseline, so no advantage (never invented)
        for m in day[subtask.start:subtask.end + 1]:
            if m.role != "assistant" or m.harness:
                continue
            if ruled.get(m.episode_id, subtask.key) == subtask.key:
                out[m.step_id].append(task_advantage[subtask.key])
    return out


def episode_row(episode: Episode, split: str, covered: dict[int, list[float]],
                understanding: float | None, stray_steps: set[int],
                settings: NightConfig) -> tuple[dict, list[dict]]:
    """(training row, advantage-table rows) for one episode."""
    steps = episode.steps
    harness = [i for i, s in enumerate(steps) if (s.meta or {}).get("probe")]
    assistants = [s for i, s in enumerate(steps) if s.role == "assistant" and i not in harness]
    penalty = settings.turn_penalty * max(0, len(assistants) - 1)
    messages, advantages, overrides, table, imitate = [], [], [], [], []
    tools: list = []
    for i, step in enumerate(steps):
        if step.role == "system":
            tools = (step.meta or {}).get("tools", tools)
        message = {"role": step.role, "content": step.content or ""}
        if step.tool_calls:
            message["tool_calls"] = step.tool_calls
        if step.role == "tool":
            message.update(name=step.name or "", tool_call_id=step.tool_call_id or "")
        if step.role == "assistant" and (step.meta or {}).get("choice") == "message":
            message["choice"] = "message"  # chose words under the tool list (trainer.tokens)
        messages.append(message)
        value = None
        if step.role == "assistant" and i not in harness:
            parts = {}
            if covered.get(step.id):
                parts["task"] = sum(covered[step.id]) / len(covered[step.id])
            if understanding is not None:
                parts["understanding"] = understanding
            if parts:
                value = sum(parts.values()) / len(parts) - penalty
                parts["turn_penalty"] = -penalty
                table.append({"episode_id": episode.id, "step_id": step.id,
                              "advantage": value, "parts": parts})
            if step.id in stray_steps:
                overrides.append({"message": i, "token": -1, "advantage": settings.stray_advantage})
            if (step.meta or {}).get("demonstration"):
                imitate.append(i)  # not sampled from pi_lag: imitated, not in OAPL
                value = None
        advantages.append(value)
    row = {"kind": "episode", "episode_id": episode.id, "channel": episode.channel_id,
           "sources": [episode.id], "split": split, "tools": tools, "messages": messages, "advantages": advantages,
           "token_overrides": overrides, "harness": harness, "imitate": imitate,
           "labels": list(episode.labels)}
    return row, table


def centre(rows: list[dict], table: list[dict]) -> float:
    """Subtract the train split's mean message advantage from every episode row and from
    the advantage table, in place, leaving out the rows measured against their group's
    mean (``group_baseline``); returns the mean taken."""
    episodes = [r for r in rows if r["kind"] == "episode"]
    grouped = {r["episode_id"] for r in episodes if r.get("group_baseline")}
    centred = [r for r in episodes if r["episode_id"] not in grouped]
    trained = [a for r in centred if r["split"] == "train" for a in r["advantages"]
               if a is not None]
    mean = sum(trained) / len(trained) if trained else 0.0
    for row in centred:
        row["advantages"] = [None if a is None else a - mean for a in row["advantages"]]
    for entry in table:
        if entry["episode_id"] not in grouped:
            entry["advantage"] -= mean
            entry["parts"]["centre"] = -mean
    return mean


def value_row(prompt: list[dict], answer: str, reward: float, baseline: float,
              sources: list[int] = ()) -> dict:
    """A value prediction as a training sequence: the answer's advantage is its reward
    (-normalised error) minus the night's mean prediction reward. ``sources``: the
    episodes its prompt describes (``core.storage.copies``)."""
    messages = [*prompt, {"role": "assistant", "content": answer}]
    return {"kind": "value_prediction", "episode_id": None, "channel": "",
            "sources": sorted(sources), "split": "train",
            "tools": [], "messages": messages,
            "advantages": [None] * len(prompt) + [reward - baseline],
            "token_overrides": [], "labels": []}
