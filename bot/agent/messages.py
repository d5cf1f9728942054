"""Chat messages as the agent builds them: from stored steps, from replies, and their size.

Pure functions of the agent loop (``bot.agent.loop``), kept apart so the loop reads as
the loop.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from core.storage.store import Prefix, Step, StoredStep
from serving.client import Reply

_CHARS_PER_TOKEN = 3.5  # a cheap, conservative estimate; the server has the real count


def strip_reasoning(text: str) -> str:
    """The text without its ``<think>...</think>`` blocks (and the space after each).

    One pass with ``str.find``: the regex it replaces rescanned to the end of the text
    from every unclosed ``<think>``, quadratic in a tool output that repeats the tag."""
    if not text or "<think>" not in text:  # every history message, every turn
        return text or ""
    kept, at = [], 0
    while (start := text.find("<think>", at)) >= 0:
        end = text.find("</think>", start + len("<think>"))
        if end < 0:
            break  # an unclosed block stays, as the model wrote it
        kept.append(text[at:start])
        at = end + len("</think>")
        while at < len(text) and text[at].isspace():
            at += 1
    kept.append(text[at:])
    return "".join(kept)


def history_messages(steps: list[StoredStep]) -> list[dict]:
    """Stored steps of earlier turns as chat messages, reasoning stripped.

    System steps are skipped (each turn stores the system prompt it used), and so
    is the stray end-of-turn probe (its question, answer and go-ahead are the
    harness talking, stored for the night, not conversation). A leading tool
    observation whose call fell off the window is dropped, since a tool message
    without its call is invalid chat.
    """
    messages = []
    for step in steps:
        if step.role == "system" or (step.meta or {}).get("probe"):
            continue
        if step.role == "tool" and not messages:
            continue
        message: dict = {"role": step.role, "content": strip_reasoning(step.content)}
        if step.tool_calls:
            message["tool_calls"] = step.tool_calls
        if step.role == "tool":
            message["tool_call_id"] = step.tool_call_id or ""
            message["name"] = step.name or ""
        messages.append(message)
    return messages


def text_of(content: str | list | None) -> str:
    """A message's content as text: an image part (a vision turn) becomes a placeholder,
    so its base64 never reaches a summary prompt or a length estimate."""
    if not isinstance(content, list):
        return content or ""
    return " ".join(part.get("text", "") if part.get("type") == "text" else "[image]"
                    for part in content if isinstance(part, dict))


def estimate_tokens(messages: list[dict]) -> int:
    chars = 0
    for m in messages:  # a loop, not sum(genexpr): every step of every turn runs it
        content, calls = m.get("content"), m.get("tool_calls")
        chars += len(content) if type(content) is str else len(text_of(content))
        chars += len(json.dumps(calls)) if calls else 2  # "[]"
    return int(chars / _CHARS_PER_TOKEN) + 4 * len(messages)


def yes_no(text: str) -> str:
    """"yes" or "no" from a JSON answer or plain text; anything unclear counts as yes."""
    try:
        value = json.loads(text).get("answer", "")
    except (ValueError, AttributeError):
        value = text
    return "no" if str(value).strip().lower().startswith("no") else "yes"


def is_probe_answer(text: str) -> bool:
    """True when ``text`` is the stray probe's JSON answer shape, ``{"answer": "yes"}``."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and set(value) == {"answer"}


def recent_start(messages: list[dict], keep: int) -> int:
    """Index where the kept recent part starts; never splits a tool call from its results."""
    start = max(0, len(messages) - keep)
    while start > 0 and messages[start]["role"] == "tool":
        start -= 1
    return start


PLAIN_RESULTS = ("What your tools returned this turn (no tools are offered for this answer; "
                 "answer the last message in words):\n{lines}")
_PLAIN_RESULTS_KEPT, _PLAIN_RESULT_CHARS = 4, 400


def plain_messages(messages: list[dict], start: int, results: list[tuple[str, str]]
                   ) -> list[dict]:
    """The context of an answer asked without tools (a repeated call tripped), in words.

    Under a function-calling template the calls in a context are rendered in the
    template's own call syntax, and a small model offered no tools writes that syntax
    back as text: the first-contact trial saw the same ``functions.read_file: {...}``
    re-asked three times, then a turn that gave up. So the answer is asked from the
    conversation's words alone: the system prompt, the earlier messages that are words
    (``messages[1:start]``: history, a compaction summary), and the turn's request.
    The last distinct ``results`` ((tool, output) of this turn) go in the system prompt:
    placed before the request, the 135M model repeated them as its answer.
    """
    def words(m: dict) -> bool:
        return m["role"] in ("user", "assistant") and not m.get("tool_calls") and bool(
            text_of(m.get("content")).strip())

    system = text_of(messages[0].get("content"))
    kept = list(dict.fromkeys(results))[-_PLAIN_RESULTS_KEPT:]
    if kept:
        system += "\n\n" + PLAIN_RESULTS.format(lines="\n".join(
            f"- {name}: {output.strip()[:_PLAIN_RESULT_CHARS]}" for name, output in kept))
    head = [{"role": m["role"], "content": text_of(m.get("content"))}
            for m in messages[1:start] if words(m)]
    request = next((m for m in messages[start:] if m["role"] == "user"), None)
    text = text_of(request.get("content")) if request else ""
    return [{"role": "system", "content": system}, *head, {"role": "user", "content": text}]


def assistant_step(reply: Reply) -> Step:
    return Step(role="assistant", content=reply.content, tool_calls=reply.tool_calls or None,
                model_version=reply.model, started_at=time.time() - reply.duration_ms / 1000,
                duration_ms=reply.duration_ms, prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens,
                meta={"choice": reply.choice} if reply.choice else None)


def assistant_message(reply: Reply) -> dict:
    message: dict = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return message


def outbox_files(ctx: Any) -> list[str]:
    """Files the agent asked to send during the turn (``send_file``), drained once."""
    outbox = ctx.services.outbox if hasattr(ctx, "services") else None
    if not outbox:
        return []
    files = list(outbox)
    outbox.clear()
    return files


@dataclass
class EpisodeContext:
    """Which of the messages sent are the turn's own, and what came before them.

    ``messages[:start]`` (the system prompt, the channel history, after a
    compaction its summary) is the prompt prefix, stored once
    (``core.storage.prefixes``); ``messages[start:]`` are the episode's latest
    stored steps, one message per step. Each assistant step records both, so
    the night renders exactly what the model was sent.
    """

    start: int  # index of the episode's first message still in the context
    tools_ref: str | None
    sources: set[int] = field(default_factory=set)  # episodes whose text the prefix carries
    _prefix: Prefix | None = None
    _saved: bool = False

    def opening(self, messages: list[dict]) -> Prefix:
        """The turn's first prefix, for ``Store.start_turn`` to store with the episode."""
        self._prefix, self._saved = self._prefix_of(messages), True
        return self._prefix

    def _prefix_of(self, messages: list[dict]) -> Prefix:
        return Prefix(messages[:self.start], self.tools_ref, tuple(self.sources))

    def for_step(self, messages: list[dict], tools: bool) -> tuple[dict, Prefix | None]:
        """(the ``context`` meta of an assistant step sent ``messages``, the prefix to store
        with it: None once stored)."""
        if self._prefix is None:
            self._prefix = self._prefix_of(messages)
        meta = {"prefix": self._prefix.ref, "tail": len(messages) - self.start}
        if not tools:
            meta["tools"] = False
        return meta, None if self._saved else self._prefix

    def saved(self) -> None:
        self._saved = True

    def compacted(self, kept_from: int, episode: int) -> None:
        """``messages[1:kept_from]`` became one summary message after the system prompt."""
        if kept_from > self.start:  # the summary covers some of the episode's own steps
            self.sources.add(episode)
        self.start = max(2, self.start - kept_from + 2)
        self._prefix, self._saved = None, False
