"""The bot's side of the night: watch the job, promote, pause the server.

``NightWatch`` launches the trainer (``bot.night.jobs``) and polls the job
row in the store:

- a job whose trainer process died without finishing is marked failed
  (``python -m trainer sleep --job N`` resumes it);
- a candidate awaiting promotion is promoted (swapped in) when
  ``night.auto_promote`` is on, once: a failed try is recorded in the job's
  progress and the candidate then waits for ``/promote``;
- with ``night.single_gpu``, the model server is stopped while the job trains
  and started again afterwards; chat messages wait in their queues meanwhile;
- every change of state or progress is passed to the front ends' listeners.

It takes the services it acts on (config, store, supervisor, releases), not
the runtime, so nothing here imports the runtime or the admin commands.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from typing import TYPE_CHECKING, Awaitable, Callable

from bot.night.jobs import ACTIVE, is_trainer, reap, start_trainer, stop_trainer
from bot.periodic import every

if TYPE_CHECKING:
    from core.config import Config
    from serving.releases import Releases
    from serving.supervisor import ServerSupervisor
    from core.storage.store import Store

logger = logging.getLogger("nightshift.night")
Listener = Callable[[dict], Awaitable[None]]


class NightWatch:
    """A background task owned by the runtime; cancelled on close."""

    def __init__(self, config: Config, store: Store, supervisor: ServerSupervisor,
                 releases: Releases, interval_s: float = 2.0) -> None:
        self.config = config
        self.store = store
        self.supervisor = supervisor
        self.releases = releases
        self.interval_s = interval_s
        self.listeners: list[Listener] = []
        self.children: dict[int, subprocess.Popen] = {}
        self._seen: dict[int, tuple] = {}
        self._paused_for: int | None = None
        self._task: asyncio.Task | None = None

    @property
    def server_paused(self) -> bool:
        """True while the server is stopped for a single-GPU night."""
        return self._paused_for is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(
                every(lambda: self.interval_s, self.poll, "night watch poll"), name="night-watch")

    async def close(self) -> None:
        """Stop watching, and stop the nights this bot started: they need its model server.
        Such a night is marked failed at the next start, and resumes with its job id."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for job_id, child in self.children.items():
            stop_trainer(child.pid, job_id)
        for child in self.children.values():
            await asyncio.to_thread(reap, child)
        self.children.clear()

    async def launch(self, job_id: int) -> None:
        child = start_trainer(self.config, job_id)
        self.children[job_id] = child
        # The job names its process at once, so the watch never judges it by a stale pid.
        await self.store.update_job(job_id, pid=child.pid)

    async def resume(self, job_id: int) -> None:
        """Start a failed or cancelled night again where it stopped. Its dead process's pid
        goes with its old state: a poll between the two writes would otherwise find a queued
        night with a dead process and fail it again (seen under a loaded test suite)."""
        await self.store.update_job(job_id, state="queued", error="", pid=0)
        await self.launch(job_id)

    async def poll(self) -> None:
        for job in await self.store.jobs("sleep"):
            child = self.children.get(job["id"])
            if child is not None and child.poll() is not None:
                self.children.pop(job["id"])  # reaped
            if job["state"] in ACTIVE and job["pid"] and not is_trainer(job["pid"], job["id"]):
                await self.store.update_job(job["id"], state="failed", error=(
                    "the trainer process died; resume with: python -m trainer sleep --job "
                    f"{job['id']}"))
                job = await self.store.job(job["id"])
            await self._single_gpu(job)
            if (job["state"] == "awaiting_promotion" and self.config.night.auto_promote
                    and "promotion" not in job["progress"]):  # one try per candidate
                await self._promote(job)
            await self._notify(job)

    async def _promote(self, job: dict) -> None:
        """Try this night's own candidate, once: a failure waits for /promote (it is
        not retried every poll), and another night's candidate is never touched."""
        progress = job["progress"]
        release_id = progress.get("release_id")
        if "promotion_tried" in progress:
            return
        if release_id is None:
            text = "no candidate release is recorded for this night; nothing promoted"
        else:
            text = await self.releases.promote(release_id)
        state = "live" if text.startswith("Now serving") else "awaiting_promotion"
        await self.store.update_job(job["id"], state=state, progress={
            **progress, "promotion": text, "promotion_tried": release_id})

    async def _single_gpu(self, job: dict) -> None:
        if not self.config.night.single_gpu:
            return
        if job["state"] == "training" and self._paused_for is None:
            self._paused_for = job["id"]
            await self.supervisor.pause()  # messages wait for the morning, with no timeout
        elif self._paused_for == job["id"] and job["state"] != "training":
            self._paused_for = None
            await self.supervisor.resume()

    async def _notify(self, job: dict) -> None:
        key = (job["state"], job["updated_at"])
        first = job["id"] not in self._seen
        if self._seen.get(job["id"]) == key:
            return
        self._seen[job["id"]] = key
        if first and job["state"] not in (*ACTIVE, "awaiting_promotion"):
            return  # old news from before this bot started
        for listener in list(self.listeners):
            try:
                await listener(job)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("night progress listener failed")
