"""A practice task's reference answer, recorded as a turn of the agent's own.

When no judged attempt of a task passed, its group has nothing relative to learn;
the reference joins it as one more episode (``bot.practice.runner``): the same
context the agent sends a fresh channel (its system prompt, its tool list), the
reference as its direct answer, marked ``demonstration``.
"""

from __future__ import annotations

import time
from typing import Any

from bot.agent import Agent
from bot.messages import EpisodeContext
from bot.serving.chat_format import chat_format_name
from bot.serving.wire import needs_tool_choice
from bot.storage.store import Step


async def demonstrate(agent: Agent, channel: str, text: str, answer: str,
                      speaker: str = "user") -> int:
    """Record ``answer`` as ``agent``'s reply to ``text`` in ``channel``; returns the episode."""
    system = agent.system_prompt(channel)
    schemas = agent.tools.schemas()
    tools_ref = await agent.store.tool_set_ref(schemas)
    # A fresh channel's context: the system prompt alone is the prefix (no history).
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    context = EpisodeContext(1, tools_ref)
    now = time.time()
    episode, _ = await agent.store.start_turn(channel, agent.config.model.alias, [
        Step(role="system", content=system, meta={"tools_ref": tools_ref}, started_at=now),
        Step(role="user", content=text, name=speaker, started_at=now)], name=channel,
        prefix=context.opening(messages))
    meta: dict[str, Any] = {"demonstration": True,
                            "context": context.for_step(messages, bool(schemas))[0]}
    if schemas and needs_tool_choice(chat_format_name(agent.config)):
        meta["choice"] = "message"  # as if chosen under the tool list (trainer.tokens)
    await agent.store.add_step(episode, Step(role="assistant", content=answer, meta=meta,
                                             started_at=time.time()))
    await agent.store.end_episode(episode, "complete")
    return episode
