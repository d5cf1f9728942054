"""Everything a front end talks to, built once and closed in reverse order.

The Discord and console front ends both hold one Runtime: the store, the
supervised model server, the LLM client, the tool registry, each channel's
tool context (workspace, journal, private state) and the channel workers.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.agent import Agent, TurnResult
from bot.channels import ChannelWorkers, RuleStrayDetector
from bot.config import Config, ConfigError
from bot.serving.client import LLM
from bot.night.releases import Releases, serve_live
from bot.night.watch import NightWatch
from bot.serving.supervisor import ServerSupervisor
from bot.storage.store import Store
from sandbox.paths import workspace_for
from tools import Registry, ToolContext, default_registry
from sandbox.process import Sandbox
from tools.python_jobs import job_runner
from tools.system import read_sys_section

logger = logging.getLogger("nightshift")


class ChannelSpaces:
    """One ToolContext per channel, made on first use and kept (its journal is live)."""

    def __init__(self, data_dir: Path, **services: Any) -> None:
        self.data_dir = data_dir
        self.services = services
        self._contexts: dict[str, ToolContext] = {}

    def context(self, channel: str) -> ToolContext:
        ctx = self._contexts.get(channel)
        if ctx is None:
            workspace = workspace_for(self.data_dir / "workspaces", channel)
            state_dir = self.data_dir / "channels" / workspace.root.name
            outbox: list[str] = []
            ctx = ToolContext.open(channel, workspace, state_dir, outbox=outbox,
                                   send_file=outbox.append, **self.services)
            job_runner(ctx)  # finds jobs a previous run left behind and reports them lost
            self._contexts[channel] = ctx
        return ctx

    async def close(self) -> None:
        """Stop every channel's background Python jobs (they are reported lost)."""
        for ctx in self._contexts.values():
            runner = ctx.services.get("jobs_runner")
            if runner is not None:
                await runner.close()

    def sys_section(self, channel: str) -> str:
        return read_sys_section(self.context(channel).state_dir)


def _registry(config: Config) -> Registry:
    """Every tool, or only those named in ``agent.tools``."""
    full = default_registry()
    wanted = config.agent.tools
    if not wanted:
        return full
    unknown = sorted(set(wanted) - set(full.names()))
    if unknown:
        raise ConfigError(f"agent.tools = {unknown} names unknown tools. Fix: use names from "
                          f"{', '.join(full.names())}, or [] for all.")
    chosen = Registry()
    for name in wanted:
        chosen.register(full.get(name))
    return chosen


def _services(config: Config, store: Store, supervisor: Any) -> dict[str, Any]:
    """What the tools may use beyond their workspace; loaded once, shared by channels."""
    from bot.storage.embedder import MiniLMEmbedder
    from tools.notes import NoteStore

    embedder = MiniLMEmbedder()

    def server_status() -> dict:
        return {"ready": supervisor.ready, "url": supervisor.base_url, "pid": supervisor.pid,
                "restarts": supervisor.restarts}

    return {"embedder": embedder, "status": server_status, "vision": config.model.vision,
            "sandbox": Sandbox(allow_unsandboxed=config.sandbox.allow_unsandboxed),
            "notes": NoteStore(config.data_dir / "notes", embedder),
            "image_cache": config.data_dir / "images"}


@dataclass
class Runtime:
    config: Config
    store: Store
    supervisor: ServerSupervisor
    llm: LLM
    registry: Registry
    spaces: ChannelSpaces
    agent: Agent
    workers: ChannelWorkers
    releases: Releases
    night: NightWatch
    _stack: AsyncExitStack = field(repr=False, default_factory=AsyncExitStack)

    @classmethod
    async def start(cls, config: Config, *, supervisor: ServerSupervisor | None = None,
                    llm: Any = None, start_server: bool = True) -> Runtime:
        """Open the store, start (or adopt) the server, and wire the agent."""
        stack = AsyncExitStack()
        try:
            store = await Store.open(config.store_path)
            stack.push_async_callback(store.close)
            supervisor = supervisor or ServerSupervisor(config)
            serving = await serve_live(store, supervisor)  # what serves is what is live
            logger.info("serving %s", serving or f"the base model ({supervisor.gguf.name})")
            if start_server:
                stack.push_async_callback(supervisor.stop)
                await supervisor.start()
            if llm is None:
                llm = LLM(config, supervisor)
                stack.push_async_callback(llm.close)
            registry = _registry(config)
            spaces = ChannelSpaces(config.data_dir, **_services(config, store, supervisor))
            stack.push_async_callback(spaces.close)
            agent = Agent(config, llm, store, registry, spaces.context, spaces.sys_section,
                          stray=RuleStrayDetector())
            workers = ChannelWorkers(agent.turn, config.agent.queue_size)
            stack.push_async_callback(workers.close)
            releases = Releases(config, store, supervisor)
            night = NightWatch(config, store, supervisor, releases)
            stack.push_async_callback(night.close)
        except BaseException:
            await stack.aclose()
            raise
        night.start()
        return cls(config, store, supervisor, llm, registry, spaces, agent, workers, releases,
                   night, stack)

    async def turn(self, channel: str, text: str, speaker: str = "user") -> TurnResult:
        """Queue a message on its channel and wait for the reply (raises channels.Busy)."""
        return await self.workers.submit(channel, text, speaker)

    async def close(self) -> None:
        await self._stack.aclose()
