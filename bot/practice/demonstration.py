"""A practice task's reference answer, recorded as a turn of the agent's own.

When no judged attempt of a task passed, its group has nothing relative to learn;
the reference joins it as one more episode (``bot.practice.runner``): the same
context the agent sends a fresh channel (its system prompt, its tool list), the
reference as its direct answer, marked ``demonstration``. A reference that shows
tool calls (``Task.calls``) is recorded as the agent would have made them: each
call as an assistant step, its real output (run by ``run_calls`` through the
tools, in the demonstration's own workspace) as the observation, then the answer.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from bot.agent.loop import Agent
from bot.agent.messages import EpisodeContext
from core.model.chat_format import chat_format_name
from core.model.wire import needs_tool_choice
from core.storage.store import Step


@dataclass
class Shown:
    """One call of a reference, run: what the model is shown it wrote, and its output."""

    name: str
    arguments: dict
    output: str
    meta: dict = field(default_factory=dict)


async def run_calls(agent: Agent, ctx: Any, calls: tuple[tuple[str, dict], ...]
                    ) -> list[Shown] | str:
    """Run a reference's calls in ``ctx`` (the demonstration channel's tools); the calls
    with their outputs, or why they cannot be shown (a tool the agent is not offered
    would teach a call the model never sees in its list)."""
    offered = agent.tool_names()
    missing = sorted({name for name, _ in calls} - offered)
    if missing:
        return (f"it calls {', '.join(missing)}, which the agent is not offered "
                f"(agent.tools offers {', '.join(sorted(offered)) or 'none'})")
    shown = []
    for name, arguments in calls:
        result = await agent.tools.call(name, arguments, ctx)
        if not result.ok:
            return f"its call {name} failed: {result.output[:300]}"
        shown.append(Shown(name, arguments, agent.observation(result),
                           {"ok": True, **result.meta}))
    return shown


async def demonstrate(agent: Agent, channel: str, text: str, answer: str,
                      speaker: str = "user", shown: list[Shown] | tuple = ()) -> int:
    """Record ``shown`` calls, then ``answer``, as ``agent``'s reply to ``text`` in
    ``channel``; returns the episode."""
    system = agent.system_prompt(channel)
    schemas = agent.tools.schemas()
    tools_ref = await agent.store.tool_set_ref(schemas)
    # A fresh channel's context: the system prompt alone is the prefix (no history).
    messages: list[dict] = [{"role": "system", "content": system},
                            {"role": "user", "content": text}]
    context = EpisodeContext(1, tools_ref)
    now = time.time()
    episode, _ = await agent.store.start_turn(channel, agent.config.model.alias, [
        Step(role="system", content=system, meta={"tools_ref": tools_ref}, started_at=now),
        Step(role="user", content=text, name=speaker, started_at=now)], name=channel,
        prefix=context.opening(messages))
    for i, call in enumerate(shown):
        tool_call = {"id": f"call_demo_{i}", "type": "function",
                     "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
        meta = {"demonstration": True, "context": context.for_step(messages, True)[0]}
        await agent.store.add_step(episode, Step(role="assistant", content="",
                                                 tool_calls=[tool_call], meta=meta,
                                                 started_at=time.time()))
        messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call]})
        await agent.store.add_step(episode, Step(role="tool", content=call.output,
                                                 tool_call_id=tool_call["id"], name=call.name,
                                                 meta=call.meta, started_at=time.time()))
        messages.append({"role": "tool", "tool_call_id": tool_call["id"], "name": call.name,
                         "content": call.output})
    meta: dict[str, Any] = {"demonstration": True,
                            "context": context.for_step(messages, bool(schemas))[0]}
    if schemas and needs_tool_choice(chat_format_name(agent.config)):
        meta["choice"] = "message"  # as if chosen under the tool list (trainer.tokens)
    await agent.store.add_step(episode, Step(role="assistant", content=answer, meta=meta,
                                             started_at=time.time()))
    await agent.store.end_episode(episode, "complete")
    return episode
