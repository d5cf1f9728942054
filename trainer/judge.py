"""The judge: the served model reads a channel's day in windows of messages and
reports the sub-tasks it sees, with a reward for each.

A channel's eligible episodes are laid end to end as one message list (system
prompts left out). Each window of ``night.window_messages`` messages gets one
conversation with the judge, which answers under a JSON schema, either

    {"action": "extend", "before": n, "after": m, ...}  to see more context, or
    {"action": "report", "subtasks": [{start, end, description, score}]}

Scores are integers -2..2 (reward = score / 2, in [-1, 1]) and message indices
are enums of the indices shown, so llama.cpp's grammar keeps even a 135M
model's reply valid. A reply that still fails validation is retried, and after
``night.judge_attempts`` the window is skipped and counted, never invented.

A sub-task's length is the number of turns it used: its assistant messages
(the harness's stray-turn probe not counted).

The judge reads every episode blind, labelled or not: rewards that outrank it
(a check's, a person's) are applied afterwards by ``trainer.rewards``, which
also measures how often the judge agrees with them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from core.config import NightConfig
from core.storage.store import Episode
from trainer.client import JsonClient

JUDGE_SYSTEM = (
    "You judge an AI assistant's work in a chat. You see numbered messages. Find the "
    "sub-tasks the user asked for in the window, each as the range of messages from the "
    "request to the answer, with a short description and a score: 2 = done well, 1 = mostly "
    "done, 0 = unclear, -1 = poorly done, -2 = failed or harmful. If you need to see earlier "
    "or later messages to judge, answer with action \"extend\". Otherwise answer with action "
    "\"report\". Answer only with JSON."
)
_SHOWN_CHARS = 600


@dataclass
class Message:
    index: int  # position in the channel's day
    episode_id: int
    step_id: int
    role: str
    content: str
    tool_calls: list | None = None
    harness: bool = False  # the stray-turn probe: the harness's text, not the agent's


@dataclass
class SubTask:
    channel: str
    start: int
    end: int
    description: str
    reward: float
    length: int
    source: str = "judge"  # "verifier" | "person" | "judge" (trainer.rewards)
    key: str = ""
    check: str = ""  # which check or label gave a verifier/person reward
    group: str = ""  # practice attempts of one task share a group (their mean is the baseline)
    looped: bool = False  # a check's reward held down because the attempt's reply looped
    episodes: list[int] = field(default_factory=list)  # whose messages it was written from

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class WindowResult:
    channel: str
    start: int
    status: str  # "judged" | "skipped"
    subtasks: list[SubTask] = field(default_factory=list)
    attempts: int = 0
    extends: int = 0
    reason: str = ""
    episodes: list[int] = field(default_factory=list)  # whose messages the judge was shown


def channel_days(episodes: list[Episode]) -> dict[str, list[Message]]:
    """Each channel's eligible episodes laid end to end, without system prompts."""
    days: dict[str, list[Message]] = {}
    for episode in sorted(episodes, key=lambda e: (e.started_at, e.id)):
        day = days.setdefault(episode.channel_id, [])
        for step in episode.steps:
            if step.role != "system":
                day.append(Message(len(day), episode.id, step.id, step.role, step.content or "",
                                   step.tool_calls, bool((step.meta or {}).get("probe"))))
    return days


def turns_used(day: list[Message], start: int, end: int) -> int:
    return sum(1 for m in day[start:end + 1] if m.role == "assistant" and not m.harness)


def render(day: list[Message], lo: int, hi: int) -> str:
    lines = []
    for m in day[lo:hi]:
        text = m.content.strip().replace("\n", " ")
        if m.tool_calls:
            calls = ", ".join(c["function"]["name"] for c in m.tool_calls)
            text = (text + " " if text else "") + f"[calls tools: {calls}]"
        if len(text) > _SHOWN_CHARS:
            text = text[:_SHOWN_CHARS] + " [...]"
        lines.append(f"[{m.index}] {m.role}: {text}")
    return "\n".join(lines)


def report_schema(lo: int, hi: int, view_lo: int, view_hi: int, extend_limit: int) -> dict:
    """Indices as enums: a sub-task starts inside the window and ends inside the view."""
    steps = list(range(0, extend_limit + 1))
    subtask = {"type": "object", "properties": {
        "start": {"enum": list(range(lo, hi))},
        "end": {"enum": list(range(lo, view_hi))},
        "description": {"type": "string"},
        "score": {"enum": [-2, -1, 0, 1, 2]}},
        "required": ["start", "end", "description", "score"]}
    return {"type": "object", "properties": {
        "action": {"enum": ["report", "extend"]},
        "before": {"enum": steps}, "after": {"enum": steps},
        "subtasks": {"type": "array", "items": subtask}},
        "required": ["action", "before", "after", "subtasks"]}


def validate(answer: object, channel: str, day: list[Message], lo: int, hi: int,
             view_hi: int) -> list[SubTask]:
    """The report's sub-tasks; raises ValueError when the answer is not a valid report."""
    if not isinstance(answer, dict) or not isinstance(answer.get("subtasks"), list):
        raise ValueError("not a report object")
    out = []
    for item in answer["subtasks"]:
        start, end = item.get("start"), item.get("end")
        score, text = item.get("score"), str(item.get("description", "")).strip()
        if not (isinstance(start, int) and isinstance(end, int) and lo <= start < hi
                and start <= end < view_hi):
            raise ValueError(f"sub-task range {start}..{end} outside the window {lo}..{hi - 1}")
        if score not in (-2, -1, 0, 1, 2) or not text:
            raise ValueError("sub-task without a valid score and description")
        out.append(SubTask(channel, start, end, text, score / 2, turns_used(day, start, end),
                           key=f"{channel}:{start}:{end}"))
    return out


class Judge:
    def __init__(self, client: JsonClient, settings: NightConfig) -> None:
        self.client = client
        self.settings = settings

    async def judge_window(self, channel: str, day: list[Message], lo: int) -> WindowResult:
        hi = min(lo + self.settings.window_messages, len(day))
        view_lo, view_hi = lo, hi
        attempts = extends = 0
        problem = ""
        while attempts < self.settings.judge_attempts:
            attempts += 1
            # Greedy first; a retry samples, or it would repeat the same invalid reply.
            answer, raw = await self.client.ask(self._prompt(day, lo, hi, view_lo, view_hi),
                                                report_schema(lo, hi, view_lo, view_hi,
                                                              self.settings.extend_limit),
                                                self.settings.judge_max_tokens, "judge_report",
                                                temperature=0.0 if attempts == 1 else 0.7)
            if isinstance(answer, dict) and answer.get("action") == "extend" \
                    and extends < self.settings.max_extends:
                extends += 1
                attempts -= 1  # asking for context is not a failed attempt
                view_lo = max(0, view_lo - min(int(answer.get("before", 0)), self.settings.extend_limit))
                view_hi = min(len(day), view_hi + min(int(answer.get("after", 0)), self.settings.extend_limit))
                continue
            try:
                subtasks = validate(answer, channel, day, lo, hi, view_hi)
            except ValueError as exc:
                problem = f"{exc}; raw reply: {raw[:200]!r}"
                continue
            shown = sorted({m.episode_id for m in day[view_lo:view_hi]})  # for /forget
            for subtask in subtasks:
                subtask.episodes = shown
            return WindowResult(channel, lo, "judged", subtasks, attempts, extends,
                                episodes=shown)
        return WindowResult(channel, lo, "skipped", [], attempts, extends, reason=problem,
                            episodes=sorted({m.episode_id for m in day[view_lo:view_hi]}))

    def _prompt(self, day: list[Message], lo: int, hi: int, view_lo: int, view_hi: int) -> list[dict]:
        context = ""
        if view_lo < lo:
            context += f"Earlier context:\n{render(day, view_lo, lo)}\n\n"
        text = f"{context}Window to judge (messages {lo} to {hi - 1}):\n{render(day, lo, hi)}"
        if view_hi > hi:
            text += f"\n\nLater context:\n{render(day, hi, view_hi)}"
        return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": text}]
