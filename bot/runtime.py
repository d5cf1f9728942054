"""Everything a front end talks to, built once and closed in reverse order.

The Discord and console front ends both hold one Runtime: the store, the
supervised model server, the LLM client, the tool registry, each channel's
tool context (workspace, journal, private state) and the channel workers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from bot import admin, hygiene
from bot.agent.loop import Agent, TurnResult
from bot.agent.tool_profiles import tool_names
from bot.channels import ChannelSpaces, ChannelWorkers, RuleStrayDetector
from bot.disk.watch import DiskWatch
from bot.disk.workspaces import Workspaces
from bot.night.jobs import ACTIVE
from bot.night.report import NightReports
from bot.night.schedule import Rounds, SleepSchedule
from bot.night.watch import NightWatch
from bot.practice.services import PracticeServices
from bot.selfplay.runs import SelfPlay
from bot.swarm import Swarms
from core.config import Config
from core.model.chat_format import resolve_async
from core.storage.store import Store
from sandbox.disk_budget import DiskBudget, automatic_budget, size_text
from sandbox.process import Limits, Sandbox
from sandbox.shared_limits import MemoryBudget
from serving.client import LLM
from serving.releases import Releases, serve_live
from serving.supervisor import ServerSupervisor
from tools import Registry, Services, default_registry
from tools.board import Board
from tools.filelocks import FileLocks
from tools.image_cache import ImageCache
from tools.jobs import JobSlots

logger = logging.getLogger("nightshift")


def _registry(config: Config) -> Registry:
    """The tools of ``agent.tools``'s profile (see ``bot.agent.tool_profiles``)."""
    full = default_registry()
    chosen = Registry()
    for name in tool_names(config, full.names()):
        chosen.register(full.get(name))
    return chosen


def _sandbox(config: Config, disk: DiskBudget) -> Sandbox:
    """One sandbox for every channel: the workspace quota, the memory of all runs together
    and the data folder's budget are its limits (``sandbox.shared_limits``)."""
    limits = Limits(workspace_mb=config.sandbox.workspace_quota_mb)
    memory = MemoryBudget(config.sandbox.total_memory_mb)
    logger.info("sandbox memory: %d MiB in all (%s)", memory.total_mb, memory.kind)
    return Sandbox(allow_unsandboxed=config.sandbox.allow_unsandboxed, limits=limits,
                   memory=memory, disk=disk)


async def _disk_budget(config: Config) -> DiskBudget:
    """The data folder's budget and shares, measured once before the first turn (in a
    thread: it walks the tree); ``disk.budget_mb = 0`` sets it from the free space."""
    settings = config.disk
    budget = DiskBudget(config.data_dir, (settings.budget_mb << 20) or None,
                        channel_percent=settings.channel_share_percent,
                        user_percent=settings.user_share_percent)
    used = await asyncio.to_thread(budget.refresh)
    if budget.budget is None:
        budget.budget = await asyncio.to_thread(automatic_budget, config.data_dir, used)
    logger.info("disk: the data folder uses %s of its %s budget", size_text(used),
                size_text(budget.budget))
    return budget


def _spaces(config: Config, supervisor: Any, disk: DiskBudget) -> ChannelSpaces:
    """Every channel's tool context, with what the tools may use beyond their workspace:
    loaded once, shared by the channels."""
    from core.storage.embedder import MiniLMEmbedder
    from tools.notes import NoteStore

    embedder = MiniLMEmbedder()

    def server_status() -> dict:
        return {"ready": supervisor.ready, "url": supervisor.base_url, "pid": supervisor.pid,
                "restarts": supervisor.restarts}

    notes = NoteStore(config.data_dir / "notes", embedder)
    notes.duplicate_similarity = config.notes_hygiene.duplicate_similarity
    teams = config.swarms.teams
    board = Board(config.data_dir / "board.db", {t.name: t.channels for t in teams}) \
        if teams else None
    services = Services(
        sandbox=_sandbox(config, disk), notes=notes, board=board, file_locks=FileLocks(),
        shared_notes_channels=frozenset(config.agent.shared_notes_channels),
        job_slots=JobSlots(config.sandbox.max_jobs_per_channel, config.sandbox.max_jobs_total),
        vision=config.model.vision,
        image_cache=ImageCache(config.data_dir / "images", config.disk.image_cache_mb << 20,
                               disk),
        workspace_quota_bytes=config.sandbox.workspace_quota_mb << 20, disk=disk)
    workspaces = Workspaces(config.data_dir, disk, max_count=config.disk.max_workspaces,
                            keep_throwaway=config.disk.keep_practice_workspaces)
    return ChannelSpaces(config.data_dir, _shared_workspaces(config), services,
                         status=server_status, embedder=embedder, workspaces=workspaces)


def _shared_workspaces(config: Config) -> dict[str, str]:
    """Channel -> workspace key, for the members of swarms that share one workspace."""
    return {channel: f"swarm-{team.name}" for team in config.swarms.teams
            if team.shared_workspace for channel in team.channels}


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
    rounds: Rounds = field(default_factory=Rounds)  # rounds in progress; a night waits for them
    swarms: Swarms | None = None
    schedule: SleepSchedule | None = None
    selfplay: SelfPlay | None = None  # /selfplay start|stop, and its daily schedule
    reports: NightReports | None = None  # each finished night's report, to its listeners
    # Front ends listen here for what the bot says on its own: (channel key or "", text).
    announcers: list[Callable[[str, str], Awaitable[None]]] = field(default_factory=list)
    # What practice and self-play use (bot.practice.services); front ends add a callable
    # to its ``listeners`` to show /practice's progress lines as they come.
    practice: PracticeServices | None = None

    @classmethod
    async def start(cls, config: Config, *, supervisor: ServerSupervisor | None = None,
                    llm: Any = None, start_server: bool = True) -> Runtime:
        """Open the store, start (or adopt) the server, and wire the agent."""
        stack = AsyncExitStack()
        try:
            store = await Store.open(config.store_path)
            await resolve_async(config)  # the chat format, before any request (chat_format.py)
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
            disk = await _disk_budget(config)
            spaces = _spaces(config, supervisor, disk)
            stack.push_async_callback(spaces.close)
            disk_watch = DiskWatch(disk, spaces.workspaces, config.disk.refresh_s)
            stack.push_async_callback(disk_watch.close)
            agent = Agent(config, llm, store, registry, spaces.context, spaces.sys_section,
                          stray=RuleStrayDetector())
            board = spaces.services.board
            if board is not None:
                agent.prompt_hooks.append(board.prompt_section)
            activity: list[Callable[[], None]] = []  # the schedule's, once it exists

            async def handle(channel: str, text: str, speaker: str) -> TurnResult:
                for note in activity:
                    note()
                return await agent.turn(channel, text, speaker)

            workers = ChannelWorkers(handle, config.agent.queue_size)
            stack.push_async_callback(workers.close)
            releases = Releases(config, store, supervisor)
            night = NightWatch(config, store, supervisor, releases)
            stack.push_async_callback(night.close)
        except BaseException:
            await stack.aclose()
            raise
        night.start()
        disk_watch.start()
        rt = cls(config, store, supervisor, llm, registry, spaces, agent, workers, releases,
                 night, stack)
        rt.swarms = Swarms(board, workers, rt.rounds, rt.announce)
        rt.reports = NightReports(config, store)
        night.listeners.append(rt.reports.on_job)
        stack.push_async_callback(rt.swarms.close)
        rt.practice = PracticeServices(
            config, store,
            lambda cfg: Agent(cfg, llm, store, registry, spaces.context, spaces.sys_section,
                              stray=agent.stray),
            spaces.context, rt.rounds, announce=rt.announce, retire=spaces.retire)
        rt.selfplay = SelfPlay(rt.practice)
        stack.push_async_callback(rt.selfplay.close)
        rt.selfplay.start_schedule()
        rt.schedule = _schedule(rt)
        activity.append(rt.schedule.note_activity)
        stack.push_async_callback(rt.schedule.close)
        rt.schedule.start()
        return rt

    async def announce(self, channel: str, text: str) -> None:
        """Say something the bot decided on its own, in ``channel`` ("" = the console)."""
        logger.info("#%s: %s", channel or "-", text)
        for listener in list(self.announcers):
            try:
                await listener(channel, text)
            except asyncio.CancelledError:
                raise
            except Exception:  # a front end's failure must not stop the schedule
                logger.exception("announcer failed")

    async def turn(self, channel: str, text: str, speaker: str = "user") -> TurnResult:
        """Queue a message on its channel and wait for the reply (raises channels.Busy)."""
        return await self.workers.submit(channel, text, speaker)

    async def close(self) -> None:
        await self._stack.aclose()


def _schedule(rt: Runtime, clock: Callable[[], datetime] | None = None) -> SleepSchedule:
    """The sleep schedule, acting on the runtime through admin.sleep and the store."""
    config = rt.config
    channel = config.sleep.announce_channel

    async def night_active() -> bool:
        return bool(await rt.store.jobs("sleep", list(ACTIVE)))

    async def pending() -> int:
        done = await rt.store.jobs("sleep", ["done"])
        return await rt.store.count_episodes_since(done[-1]["updated_at"] if done else 0.0)

    async def start_night(reason: str) -> str:
        return await admin.sleep(rt.store, rt.night, rt.agent, f"the schedule ({reason})",
                                 channel)

    async def announce(text: str) -> None:
        await rt.announce(channel, text)

    return SleepSchedule(
        config, clock=clock or (lambda: datetime.now(timezone.utc)),
        zone=ZoneInfo(config.sleep.time_zone), rounds=rt.rounds, night_active=night_active,
        pending=pending, start_night=start_night, announce=announce,
        clean_notes=lambda: hygiene.routine_clean_all(rt.spaces.services.notes,
                                                      rt.registry.names(), rt.turn))
