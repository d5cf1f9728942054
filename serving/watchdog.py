"""The canary watchdog: restart a server that stopped answering.

Every ``watchdog.interval_s`` one round asks: is the process alive, and does
a one-token completion (the canary) come back? A round ends in one of four
verdicts:

- ``ok``: the server answers; it is marked ready, and the failures reset;
- ``busy``: the canary timed out while the server burns CPU. A long
  generation holds llama.cpp's single slot, so this is not counted as a
  failure, but only for up to ``server.request_timeout_s``: no legitimate
  request runs longer, so a server spinning for longer fails too;
- ``failed``: one more consecutive failure;
- ``dead``: the process exited; that is enough for a restart at once.

After ``failures_before_restart`` failures the server is restarted (SIGKILL,
since a wedged server ignores SIGTERM), at most once per
``restart_cooldown_s``. An ``external`` server is the user's: requests are
held until it answers again, and it is never signalled.

The watchdog judges whichever process is current: a start, stop, restart or
swap that begins during a round owns the ready state, so that round's verdict
is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from serving.kinds import ServerStartError
from serving.probe import canary
from serving.served import Served

logger = logging.getLogger("nightshift.server")
_BUSY_CPU_S = 0.05  # CPU seconds over a canary window that mean "working, not wedged"


class Watchdog:
    """Owned by one supervisor, which starts and cancels ``run`` as a task."""

    def __init__(self, sup: Served) -> None:
        self.sup = sup
        self.failures = 0
        self.busy_since: float | None = None
        self.generation = sup.generation

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.sup.config.watchdog.interval_s)
            if self.sup.changing:
                continue  # a start, stop, restart or swap is under way; it probes for itself
            if self.sup.generation != self.generation:  # another process now: judge it afresh
                self._reset()
            try:
                await self.round()
            except ServerStartError as exc:
                # Keep watching: the next failures trigger another try after the cooldown.
                logger.error("watchdog restart failed: %s", exc)
                self.failures = 0
            except Exception:
                logger.exception("watchdog check failed")

    async def round(self) -> None:
        """One canary round, and what follows from its verdict."""
        sup, dog = self.sup, self.sup.config.watchdog
        generation = sup.generation
        verdict, why = await self._verdict()
        if sup.changing or sup.generation != generation:
            return  # marking it ready now would let requests through mid-swap
        if verdict == "ok":
            if not sup.healthy:
                logger.info("server at %s answers the canary again", sup.base_url)
            sup.release_requests()
            self._reset()
            return
        if verdict == "busy":
            logger.info("canary: %s, but the server is computing; counted as busy", why)
            self.busy_since = self.busy_since or time.monotonic()
            return
        self.failures = dog.failures_before_restart if verdict == "dead" else self.failures + 1
        sup.healthy = False
        logger.warning("canary failed (%d/%d): %s", self.failures, dog.failures_before_restart,
                       why)
        if self.failures >= dog.failures_before_restart:
            await self._act(why, generation)

    async def _verdict(self) -> tuple[str, str]:
        sup = self.sup
        status = sup.exit_status() if sup.kind.spawns else None
        if status is not None:
            return "dead", f"the server process {status}"
        cpu_before = _cpu_seconds(sup.pid)
        ok, why = await canary(sup.config, sup.base_url)
        if ok:
            return "ok", why
        cpu_used = _cpu_seconds(sup.pid) - cpu_before
        now = time.monotonic()
        busy_for = now - (self.busy_since or now)
        if _is_busy(why, cpu_used) and busy_for < sup.config.server.request_timeout_s:
            return "busy", why
        return "failed", why

    async def _act(self, why: str, generation: int) -> None:
        sup = self.sup
        if not sup.kind.spawns:
            # We cannot restart someone else's server; make requests wait for it instead.
            sup.hold_requests()
            logger.error("the external server at %s is unresponsive: %s", sup.base_url, why)
            return
        cooldown_left = sup.restart_cooldown_left()
        if cooldown_left > 0:
            logger.warning("restart deferred: %.0f s of restart cooldown left", cooldown_left)
            return
        reason = f"{self.failures} consecutive canary failures; last: {why}"
        # A swap may have replaced the server while we probed the old one: then nothing to do.
        await sup.restart(reason, hard=True, generation=generation)
        self._reset()

    def _reset(self) -> None:
        self.failures, self.busy_since, self.generation = 0, None, self.sup.generation


def _is_busy(why: str, cpu_used: float) -> bool:
    """A canary timeout while the server burns CPU means a long generation holds its slot."""
    return "timed out" in why and cpu_used >= _BUSY_CPU_S


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of ``pid`` from /proc; 0 where unknown (e.g. external)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    # After the ")" of comm, utime and stime are fields 12 and 13 (0-based), in clock ticks.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
