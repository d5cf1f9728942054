"""Advantages: the night's numbers per assistant message, and the training rows.

For each judged sub-task with a value prediction:

    A_task = (r - r_hat) + length_weight * ( -(len - len_hat) / length_scale )

Every assistant message inside the sub-task's range gets A_task (the mean, if
several sub-tasks cover it). In an episode sampled for the understanding pass,
a message's advantage is the mean of A_task and the understanding advantage
(or the latter alone where no sub-task covers the message). The turn-count
penalty then takes ``turn_penalty`` per assistant message beyond the first in
the episode. A stray end-of-turn (the agent answered "no" to "Did you mean to
end your turn?") puts ``stray_advantage`` on that message's last token as a
token-level override. Messages with no advantage are left out of OAPL.
"""

from __future__ import annotations

from collections import defaultdict

from bot.config import NightConfig
from bot.storage.store import Episode
from trainer.judge import Message, SubTask


def message_advantages(day: list[Message], subtasks: list[SubTask],
                       task_advantage: dict[str, float]) -> dict[int, list[float]]:
    """Step id -> the task advantages of the sub-tasks covering that assistant message."""
    out: dict[int, list[float]] = defaultdict(list)
    for subtask in subtasks:
        if subtask.key not in task_advantage:
            continue  # no prediction: no baseline, so no advantage (never invented)
        for m in day[subtask.start:subtask.end + 1]:
            if m.role == "assistant":
                out[m.step_id].append(task_advantage[subtask.key])
    return out


def episode_row(episode: Episode, split: str, covered: dict[int, list[float]],
                understanding: float | None, stray_steps: set[int],
                settings: NightConfig) -> tuple[dict, list[dict]]:
    """(training row, advantage-table rows) for one episode."""
    steps = episode.steps
    assistants = [s for s in steps if s.role == "assistant" and not (s.meta or {}).get("probe")]
    penalty = settings.turn_penalty * max(0, len(assistants) - 1)
    messages, advantages, overrides, table = [], [], [], []
    tools: list = []
    for i, step in enumerate(steps):
        if step.role == "system":
            tools = (step.meta or {}).get("tools", tools)
        message = {"role": step.role, "content": step.content or ""}
        if step.tool_calls:
            message["tool_calls"] = step.tool_calls
        if step.role == "tool":
            message.update(name=step.name or "", tool_call_id=step.tool_call_id or "")
        messages.append(message)
        value = None
        if step.role == "assistant":
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
        advantages.append(value)
    row = {"kind": "episode", "episode_id": episode.id, "channel": episode.channel_id,
           "split": split, "tools": tools, "messages": messages, "advantages": advantages,
           "token_overrides": overrides, "labels": list(episode.labels)}
    return row, table


def value_row(prompt: list[dict], answer: str, reward: float, baseline: float) -> dict:
    """A value prediction as a training sequence: the answer's advantage is its reward
    (-normalised error) minus the night's mean prediction reward."""
    messages = [*prompt, {"role": "assistant", "content": answer}]
    return {"kind": "value_prediction", "episode_id": None, "channel": "", "split": "train",
            "tools": [], "messages": messages,
            "advantages": [None] * len(prompt) + [reward - baseline],
            "token_overrides": [], "labels": []}
