"""The bot's side of the night: start the trainer, watch its job, promote.

The bot never imports the trainer. ``start`` launches ``python -m trainer
sleep --job N`` as a separate process (its own session and log file), so a
crashed trainer can never take the bot down. ``NightWatch`` then polls the job
row in the store:

- a job whose trainer process died without finishing is marked failed
  (``python -m trainer sleep --job N`` resumes it);
- a candidate awaiting promotion is promoted (swapped in) when
  ``night.auto_promote`` is on; otherwise it waits for ``/promote``;
- with ``night.single_gpu``, the model server is stopped while the job trains
  and started again afterwards; chat messages wait in their queues meanwhile;
- every change of state or progress is passed to the front ends' listeners.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Awaitable, Callable

if TYPE_CHECKING:
    from bot.runtime import Runtime

logger = logging.getLogger("nightshift.night")
ACTIVE = ("queued", "running", "judging", "training", "exporting", "gating")
Listener = Callable[[dict], Awaitable[None]]


def start_trainer(rt: Runtime, job_id: int) -> subprocess.Popen:
    """Launch the night process for a job; its output goes to data/logs/night-N.log."""
    logs = rt.config.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "trainer"]
    if rt.config.source is not None:
        argv += ["--config", str(rt.config.source)]
    argv += ["sleep", "--job", str(job_id)]
    with open(logs / f"night-{job_id}.log", "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _reap(child: subprocess.Popen) -> None:
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def stop_trainer(pid: int | None) -> None:
    if pid_alive(pid):
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass


class NightWatch:
    """A background task owned by the runtime; cancelled on close."""

    def __init__(self, rt: Runtime, interval_s: float = 2.0) -> None:
        self.rt = rt
        self.interval_s = interval_s
        self.listeners: list[Listener] = []
        self.children: dict[int, subprocess.Popen] = {}
        self._seen: dict[int, tuple] = {}
        self._paused_for: int | None = None
        self._task: asyncio.Task | None = None

    @property
    def asleep(self) -> bool:
        """True while the server is stopped for a single-GPU night."""
        return self._paused_for is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="night-watch")

    async def close(self) -> None:
        """Stop watching, and stop the nights this bot started: they need its model server.
        Such a night is marked failed at the next start, and resumes with its job id."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for child in self.children.values():
            stop_trainer(child.pid)
        for child in self.children.values():
            await asyncio.to_thread(_reap, child)
        self.children.clear()

    async def launch(self, job_id: int) -> None:
        child = start_trainer(self.rt, job_id)
        self.children[job_id] = child
        # The job names its process at once, so the watch never judges it by a stale pid.
        await self.rt.store.update_job(job_id, pid=child.pid)

    async def resume(self, job_id: int) -> None:
        """Start a failed or cancelled night again where it stopped."""
        await self.rt.store.update_job(job_id, state="queued", error="")
        await self.launch(job_id)

    async def _loop(self) -> None:
        while True:
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception:  # the watch must outlive any one bad poll
                logger.exception("night watch poll failed")
            await asyncio.sleep(self.interval_s)

    async def poll(self) -> None:
        for job in await self.rt.store.jobs("sleep"):
            child = self.children.get(job["id"])
            if child is not None and child.poll() is not None:
                self.children.pop(job["id"])  # reaped
            if job["state"] in ACTIVE and job["pid"] and not pid_alive(job["pid"]):
                await self.rt.store.update_job(job["id"], state="failed", error=(
                    "the trainer process died; resume with: python -m trainer sleep --job "
                    f"{job['id']}"))
                job = await self.rt.store.job(job["id"])
            await self._single_gpu(job)
            if job["state"] == "awaiting_promotion" and self.rt.config.night.auto_promote:
                await self._promote(job)
            await self._notify(job)

    async def _promote(self, job: dict) -> None:
        from bot import admin

        text = await admin.promote(self.rt, job["progress"].get("release_id"))
        state = "live" if text.startswith("Now serving") else "awaiting_promotion"
        await self.rt.store.update_job(job["id"], state=state,
                                       progress={**job["progress"], "promotion": text})

    async def _single_gpu(self, job: dict) -> None:
        if not self.rt.config.night.single_gpu:
            return
        if job["state"] == "training" and self._paused_for is None:
            self._paused_for = job["id"]
            await self.rt.supervisor.stop()
        elif self._paused_for == job["id"] and job["state"] != "training":
            self._paused_for = None
            await self.rt.supervisor.start()

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


def night_line(job: dict) -> str:
    """One line of a night's progress, for Discord and the console alike."""
    progress = job.get("progress") or {}
    parts = [f"Night #{job['id']}: {job['state']}"]
    if step := progress.get("train_step"):
        parts.append(f"step {step.get('step')}/{step.get('steps')}, OAPL {step.get('oapl', 0):.4f}")
    if counts := progress.get("counts"):
        parts.append(f"{counts.get('windows_judged', 0)} windows judged, "
                     f"{counts.get('subtasks', 0)} sub-tasks")
    if gate := progress.get("gate"):
        parts.append("gate passed" if gate.get("passed") else
                     "gate not passed: " + "; ".join(gate.get("reasons", [])))
    if job.get("error"):
        parts.append(job["error"].splitlines()[0][:300])
    return " · ".join(parts)
