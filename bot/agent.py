"""One turn of a channel's agent.

The trajectory is the message list: the user's message is stored, the context
is rebuilt from the store (so what the model saw is exactly what is stored),
the model answers, and the answer is stored before the turn returns. Every
turn is one episode in the store.

Reasoning (``<think>...</think>``) from earlier turns is dropped from later
contexts, as the night's training data will drop it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from bot.config import Config
from bot.llm import LLM, LLMError
from bot.store import Step, Store, StoredStep

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


@dataclass
class TurnResult:
    channel: str
    reply: str
    episode_id: int
    ok: bool


def strip_reasoning(text: str) -> str:
    return _THINK.sub("", text or "")


def history_messages(steps: list[StoredStep]) -> list[dict]:
    """Stored steps as chat messages, reasoning stripped."""
    messages = []
    for step in steps:
        if step.role == "system":
            continue
        message: dict = {"role": step.role, "content": strip_reasoning(step.content)}
        if step.tool_calls:
            message["tool_calls"] = step.tool_calls
        if step.role == "tool" and step.tool_call_id:
            message["tool_call_id"] = step.tool_call_id
        messages.append(message)
    return messages


class Agent:
    """Answers one message of one channel; holds no per-channel state itself."""

    def __init__(self, config: Config, llm: LLM, store: Store) -> None:
        self.config = config
        self.llm = llm
        self.store = store

    async def turn(self, channel: str, text: str, speaker: str = "user") -> TurnResult:
        await self.store.ensure_channel(channel, channel)
        episode = await self.store.start_episode(channel, self.config.model.alias)
        await self.store.add_step(episode, Step(role="user", content=text, name=speaker,
                                                started_at=time.time()))
        history = await self.store.channel_history(channel, self.config.agent.history_messages + 1)
        messages = [{"role": "system", "content": self.config.agent.system_prompt},
                    *history_messages(history)]
        try:
            reply = await self.llm.chat(messages, max_tokens=self.config.agent.max_reply_tokens,
                                       temperature=self.config.agent.temperature)
        except LLMError as exc:
            await self.store.end_episode(episode, "errored")
            return TurnResult(channel, f"(the model server failed: {exc})", episode, ok=False)
        await self.store.add_step(episode, Step(
            role="assistant", content=reply.content, model_version=reply.model,
            started_at=time.time() - reply.duration_ms / 1000, duration_ms=reply.duration_ms,
            prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens))
        await self.store.end_episode(episode, "complete")
        return TurnResult(channel, strip_reasoning(reply.content).strip(), episode, ok=True)
