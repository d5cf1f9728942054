"""What practice and self-play use of the bot, handed to them instead of the whole runtime.

A practice run needs a store to record its job and verdicts, a way to make an agent (the
day's agent class on the same server, store and tools, with the practice temperature),
each channel's tool context (where a check judges the attempt's workspace), the rounds a
due night waits for, and someone to tell its progress. A test builds one with a store
and a scripted agent alone."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bot.agent.loop import Agent
from bot.night.schedule import Rounds
from core.config import Config
from core.storage.store import Store
from tools import ToolContext


async def _quiet(channel: str, text: str) -> None:
    return None


async def _keep(channel: str) -> None:
    return None


@dataclass
class PracticeServices:
    config: Config
    store: Store
    # An agent with this config on the bot's server, store, tools and channel spaces.
    make_agent: Callable[[Config], Agent]
    context: Callable[[str], ToolContext]  # a channel's tool context: workspace, sandbox
    rounds: Rounds = field(default_factory=Rounds)  # a due night waits for those running
    # /practice's progress lines, as they come (the console prints them).
    listeners: list[Callable[[str], Awaitable[None]]] = field(default_factory=list)
    # What self-play says in a channel ("" = the console): the runtime's announce.
    announce: Callable[[str, str], Awaitable[None]] = _quiet
    # An attempt's channel is judged and done with: its workspace may be reclaimed
    # (ChannelSpaces.retire; bot.disk.workspaces keeps the newest few for inspection).
    retire: Callable[[str], Awaitable[None]] = _keep

    def agent(self, max_steps: int | None = None) -> Agent:
        """The day's agent at ``practice.temperature`` and ``max_steps`` model calls a turn
        (else the agent's own limit)."""
        agent = self.config.agent.model_copy(update={
            "temperature": self.config.practice.temperature,
            "max_steps": max_steps or self.config.agent.max_steps})
        return self.make_agent(self.config.model_copy(update={"agent": agent}))
