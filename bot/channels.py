"""Channel workers: one bounded queue and one task per channel.

Messages to one channel are handled in order; different channels run
concurrently. Serialising per channel (not globally) is what keeps a channel's
tool calls from ever seeing another channel's results or workspace: each turn
runs with its own channel's tool context, one at a time.

Also here: each channel's tool context (``ChannelSpaces``: its workspace, journal and
private state, within the bounds of ``bot.disk.workspaces``), and the stray end-of-turn
detector. A small model often ends its turn with "I'll now write the file:" and stops.
The detector flags such replies; the agent is then asked "Did you mean to end your
turn?" and, if it says no, it continues. The event is stored for the night, where it
earns a negative advantage on that message's last token.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol

from bot.disk.workspaces import Workspaces
from sandbox.paths import Workspace, workspace_path
from tools import Services, ToolContext
from tools.python_jobs import job_runner
from tools.system import read_sys_section

logger = logging.getLogger("nightshift.channels")


class Busy(Exception):
    """The channel's queue is full."""

    def __init__(self, channel: str, size: int) -> None:
        super().__init__(f"#{channel} is busy: {size} messages are already waiting. "
                         "Please try again in a moment.")


# -- tool contexts -------------------------------------------------------------


class ChannelSpaces:
    """One ToolContext per channel, made on first use and kept (its journal is live) until
    the channel is retired."""

    def __init__(self, data_dir: Path, workspace_keys: dict[str, str] | None = None,
                 services: Services | None = None, *, status: Callable[[], dict] | None = None,
                 embedder: Any = None, workspaces: Workspaces | None = None) -> None:
        self.data_dir = data_dir
        self.services = services or Services()  # each channel's context gets a copy
        self.status, self.embedder = status, embedder
        # A swarm with a shared workspace maps its members to one workspace key.
        self.workspace_keys = workspace_keys or {}
        # How many workspaces there may be, whose they are (unbounded when not given).
        self.workspaces = (Workspaces(data_dir, self.services.disk) if workspaces is None
                           else workspaces)
        self._contexts: dict[str, ToolContext] = {}

    def context(self, channel: str, owner: str | None = None) -> ToolContext:
        """The channel's context, made on first use. ``owner`` is the person a new channel
        counts against (a thread's starter); a new workspace past a bound raises
        ``SpaceRefused``, whose message is the answer to give."""
        ctx = self._contexts.get(channel)
        if ctx is None:
            key = self.workspace_keys.get(channel, channel)
            root = workspace_path(self.data_dir / "workspaces", key)
            state_dir = self.data_dir / "channels" / root.name
            if key != channel:  # a shared workspace; the journal and state stay the channel's
                digest = hashlib.sha256(channel.encode("utf-8", "surrogatepass")).hexdigest()
                state_dir = state_dir.with_name(f"{root.name}.{digest[:16]}")
            self.workspaces.admit(channel, root, state_dir, owner)
            workspace = Workspace(root)
            outbox: list[str] = []
            ctx = ToolContext.open(channel, workspace, state_dir, self.services, outbox=outbox,
                                   send_file=outbox.append, status=self.status,
                                   embedder=self.embedder)
            job_runner(ctx)  # finds jobs a previous run left behind and reports them lost
            self._contexts[channel] = ctx
        return ctx

    async def retire(self, channel: str) -> None:
        """A practice or self-play attempt was judged: stop its jobs, drop its context, and
        let its workspace be reclaimed (``Workspaces.reclaim``) once it is old enough."""
        ctx = self._contexts.pop(channel, None)
        runner = ctx.services.jobs_runner if ctx is not None else None
        if runner is not None:
            await runner.close()
        self.workspaces.retire(channel)

    async def close(self) -> None:
        """Stop every channel's background Python jobs (they are reported lost)."""
        for ctx in self._contexts.values():
            runner = ctx.services.jobs_runner
            if runner is not None:
                await runner.close()

    def sys_section(self, channel: str) -> str:
        return read_sys_section(self.context(channel).state_dir)


# -- stray end-of-turn --------------------------------------------------------


class StrayDetector(Protocol):
    def flag(self, reply: str, tool_steps: int) -> str | None:
        """Why ``reply`` looks like an unintended end of turn, or None."""


# A promise is the last sentence announcing work: "I'll write the file now."
_PROMISE = re.compile(
    r"^(?:(?:now|next|ok(?:ay)?|so|first|then),?\s+)*"
    r"(?:I'll|I will|I am going to|I'm going to|Let me|Let's)\s+(?:now\s+|just\s+|then\s+)?(\w+)",
    re.IGNORECASE)
# ...but not courtesy ("Let me know if...", "I'll be here", "I'll wait for your answer").
_NOT_WORK = {"know", "be", "wait", "keep", "remember", "hope", "leave", "stay", "stop", "end"}
# ...nor an offer that waits for the user: "I'll add tests if you want."
_OFFER = re.compile(r"\b(?:if|when|once|whenever|should)\s+you\b|\bif (?:needed|you'd)\b",
                    re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_CLAIM = re.compile(
    r"\bI(?: have|'ve)\s+(?:now\s+)?(created|written|saved|run|executed|updated|deleted|edited)\b",
    re.IGNORECASE)


def last_sentence(text: str) -> str:
    sentences = [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]
    return sentences[-1] if sentences else ""


class RuleStrayDetector:
    """Rule-based first version; a learned classifier can replace it behind the Protocol.

    Only how the reply ends counts: a reply that promised work mid-way and then
    ended politely ("Let me know if you need anything else.") is an ordinary ending."""

    def flag(self, reply: str, tool_steps: int) -> str | None:
        text = reply.strip()
        if not text:
            return None
        if text.endswith(":"):
            return "ends on a colon"
        last = last_sentence(text)
        promise = _PROMISE.match(last)
        if (promise and promise.group(1).lower() not in _NOT_WORK and not last.endswith("?")
                and not _OFFER.search(last)):
            return "promises work it has not done"
        if tool_steps == 0 and _CLAIM.search(text):
            return "announces work it did not do (no tool was called)"
        return None


# -- workers --------------------------------------------------------------------


@dataclass
class _Job:
    text: str
    speaker: str
    future: asyncio.Future = field(repr=False)


Handler = Callable[[str, str, str], Awaitable[object]]


class ChannelWorkers:
    """Owns one queue and one worker task per channel, and cancels them on close."""

    def __init__(self, handle: Handler, queue_size: int = 16) -> None:
        self._handle = handle
        self._queue_size = queue_size
        self._queues: dict[str, asyncio.Queue[_Job]] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    def lock(self, channel: str) -> asyncio.Lock:
        """Held by the channel's worker during each turn: anything else that writes the
        channel's workspace or journal (an admin's /sys reset) takes it too."""
        return self._locks.setdefault(channel, asyncio.Lock())

    def full(self, channel: str) -> bool:
        """Whether a message to ``channel`` would be refused as busy right now."""
        queue = self._queues.get(channel)
        return queue is not None and queue.full()

    def queue_sizes(self) -> dict[str, int]:
        return {channel: queue.qsize() for channel, queue in self._queues.items()}

    async def submit(self, channel: str, text: str, speaker: str = "user") -> object:
        """Queue a message and wait for its turn's result. Raises Busy when full."""
        return await self.enqueue(channel, text, speaker)

    def enqueue(self, channel: str, text: str, speaker: str = "user") -> asyncio.Future:
        """Queue a message; the future resolves to the turn's result."""
        if self._closed:
            raise RuntimeError("channel workers are closed")
        queue = self._queues.get(channel)
        if queue is None:
            queue = self._queues[channel] = asyncio.Queue(self._queue_size)
            self._tasks[channel] = asyncio.create_task(self._work(channel, queue),
                                                       name=f"channel:{channel}")
        future = asyncio.get_running_loop().create_future()
        try:
            queue.put_nowait(_Job(text, speaker, future))
        except asyncio.QueueFull:
            raise Busy(channel, queue.qsize()) from None
        return future

    async def _work(self, channel: str, queue: asyncio.Queue[_Job]) -> None:
        while True:
            job = await queue.get()
            try:
                if not job.future.cancelled():
                    async with self.lock(channel):
                        result = await self._handle(channel, job.text, job.speaker)
                    job.future.set_result(result)
            except asyncio.CancelledError:
                job.future.cancel()
                raise
            except Exception as exc:  # one failed turn must not stop the channel
                logger.exception("turn failed in #%s", channel)
                if not job.future.done():
                    job.future.set_exception(exc)
            finally:
                queue.task_done()

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        for queue in self._queues.values():
            while not queue.empty():
                queue.get_nowait().future.cancel()
        self._tasks.clear()
