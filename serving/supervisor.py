"""Supervisor for the local llama.cpp server, with a canary watchdog.

The supervisor starts the server in its own session (so one signal reaches the
whole process group), sends its output to a log file under
``data_dir/logs``, and calls it ready only after ``GET /v1/models`` answers
*and* a one-token chat completion (the canary) succeeds: llama.cpp can answer
its health routes while generation is wedged, so only a real completion counts.

The watchdog (``serving.watchdog``) repeats the canary and restarts a server that
stopped answering; meanwhile the ready event is cleared, so ``serving.client`` waits
instead of failing. The swap (``serving.swap``) uses only the swap interface below.
Where it answers is recorded for the night's process (``core.model.served_at``).

Server kinds sit behind the small ``ServerKind`` protocol: ``llama-cpp-python``
(``python -m llama_cpp.server`` through ``core.model.shim``, which turns off
the chat template's HTML escaping), ``llama-server`` (llama.cpp's binary) and
``external`` (started by the user; we only probe it and never signal it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

from core.config import Config
from core.model.served_at import record
from serving import orphans
from serving import swap as swapping
from serving.kinds import (
    SERVER_KINDS,
    ServerKind,
    ServerNotReady,
    ServerStartError,
    server_kind,
)
from serving.probe import log_tail, probe
from serving.swap import SWAP_MODES
from serving.watchdog import Watchdog

logger = logging.getLogger("nightshift.server")

_POLL_S = 0.2  # how often start() probes and stop() checks for exit
_LOG_ROTATE_BYTES = 10 * 1024 * 1024
_DRAIN_POLL_S = 0.05

# Re-exported for callers of serving.supervisor.
__all__ = ["SERVER_KINDS", "SWAP_MODES", "ServerKind", "ServerNotReady", "ServerStartError",
           "ServerSupervisor", "server_kind"]


# ---------------------------------------------------------------- supervisor


class Client(Protocol):
    """What a supervisor asks the clients registered with it (``serving.client.LLM``)."""

    def in_flight(self, url: str) -> int:
        """How many requests to ``url`` are sent and not yet answered."""


class ServerSupervisor:
    """Owns one server process (or, for ``external``, one endpoint) and its watchdog.

    ``swap`` (the strategies live in ``serving.swap``) replaces the served GGUF
    without losing a request, through the public swap interface below."""

    def __init__(
        self,
        config: Config,
        gguf: Path | None = None,
        port: int | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.config = config
        self.kind = server_kind(config.server.kind)
        self.gguf = Path(gguf) if gguf else config.served_gguf
        self.lora: Path | None = None  # a LoRA GGUF served on top (adapter-only releases)
        self.host = config.server.host
        self.port = port or config.server.port
        self.log_path = log_path or config.data_dir / "logs" / f"server-{self.port}.log"
        self.healthy = False
        self.paused = False  # stopped on purpose (a single-GPU night): requests wait, no timeout
        self.restarts = 0
        self.last_restart_reason: str | None = None
        self._proc: subprocess.Popen | None = None
        self._ready = asyncio.Event()
        self._lock = asyncio.Lock()  # one start/stop/restart/swap at a time
        self._watchdog: asyncio.Task | None = None
        self._last_restart_at = float("-inf")
        self.generation = 0  # counts the processes we served; the watchdog notices a new one
        self._clients: weakref.WeakSet = weakref.WeakSet()  # asked before a swap stops a server
        self.records_url = True  # a standby records only once it takes over (switch_to)

    # -- state

    @property
    def base_url(self) -> str:
        if not self.kind.spawns:
            return self.config.base_url
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def pid_file(self) -> Path:
        """Names the server on this port while it runs (``serving.orphans``)."""
        return self.config.data_dir / "run" / f"server-{self.port}.pid"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self.exit_status() is None else None

    @property
    def ready(self) -> bool:
        self._notice_death()
        return self._ready.is_set()

    async def wait_ready(self, timeout: float | None = None) -> None:
        self._notice_death()
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            raise ServerNotReady(
                f"the model server at {self.base_url} was not ready within {timeout} s "
                f"(last restart: {self.last_restart_reason or 'none'}; log {self.log_path})"
            ) from None

    # -- lifetime

    async def start(self, *, watchdog: bool = True) -> None:
        """Start (or, for ``external``, wait for) the server until the canary passes."""
        async with self._lock:
            if self.kind.spawns and self.pid is None:
                await self._launch()
            elif not self.kind.spawns:
                self.kind.check(self.config, self.gguf)
                await self._await_ready()
            self._mark_ready()
        if self.records_url:
            record(self.config.data_dir, self.base_url)
        if watchdog:
            self.start_watchdog()

    async def stop(self) -> None:
        """Cancel the watchdog, then SIGTERM the process group and SIGKILL after the grace."""
        await self._cancel_watchdog()
        async with self._lock:
            self._ready.clear()
            self.healthy = False
            await self._kill(hard=False)

    close = stop

    async def pause(self) -> None:
        """Stop the server for a while (a single-GPU night trains); clients wait for
        ``resume`` however long it takes, instead of timing out."""
        self.paused = True
        await self.stop()

    async def resume(self) -> None:
        try:
            await self.start()
        finally:
            self.paused = False  # a failed start is then an ordinary error for the clients

    async def restart(self, reason: str, *, hard: bool = False,
                      generation: int | None = None) -> None:
        """Stop and start again; ``hard`` skips SIGTERM (a wedged server ignores it).

        With ``generation``, only if the same process still serves (the watchdog's
        verdict was about it, not about a server a swap brought in meanwhile)."""
        async with self._lock:
            if generation is not None and generation != self.generation:
                return
            await self._restart_locked(reason, hard=hard)

    def start_watchdog(self) -> None:
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(Watchdog(self).run(),
                                                 name=f"watchdog:{self.port}")

    @property
    def changing(self) -> bool:
        """True while a start, stop, restart or swap holds the lock."""
        return self._lock.locked()

    def restart_cooldown_left(self) -> float:
        return self._last_restart_at + self.config.watchdog.restart_cooldown_s - time.monotonic()

    # -- the swap (strategies in serving.swap, through this interface only)

    async def swap(self, gguf: Path, *, mode: str = "blue-green", reason: str = "",
                   lora: Path | None = None) -> None:
        """Serve ``gguf`` (and ``lora``) instead of the current model; no request is lost.

        Raises ServerStartError (the old model keeps serving) when the new one cannot
        start, ValueError for an unknown mode."""
        await swapping.swap(self, gguf, mode=mode, reason=reason, lora=lora)

    def register_client(self, client: Client) -> None:
        """A swap waits for ``client``'s requests on a server before stopping it.

        Held weakly: a client that is garbage collected needs no unregistering."""
        self._clients.add(client)

    def in_flight(self, url: str) -> int:
        """Requests in flight on ``url`` over all registered clients."""
        url = url.rstrip("/")
        return sum(client.in_flight(url) for client in list(self._clients))

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold the lock that keeps starts, stops, restarts and swaps from overlapping."""
        async with self._lock:
            yield

    async def start_standby(self, gguf: Path, lora: Path | None) -> ServerSupervisor:
        """A second server with ``gguf`` on a free port, canary passed, no watchdog; on
        any failure it leaves no process behind."""
        standby = type(self)(self.config, gguf=gguf, port=_free_port(self.host))
        standby.lora = lora
        standby.records_url = False
        await standby.start(watchdog=False)
        return standby

    def switch_to(self, standby: ServerSupervisor) -> None:
        """Serve from ``standby``'s process and give it ours (to drain and stop);
        synchronous, so every client's next request goes to the new server."""
        self._proc, standby._proc = standby._proc, self._proc
        self.port, standby.port = standby.port, self.port
        self.gguf, standby.gguf = standby.gguf, self.gguf
        self.lora, standby.lora = standby.lora, self.lora
        self.log_path, standby.log_path = standby.log_path, self.log_path
        self.generation += 1
        self._mark_ready()
        record(self.config.data_dir, self.base_url)  # the night's process finds it there

    def hold_requests(self) -> None:
        """New requests wait in the clients until ``release_requests``."""
        self._ready.clear()
        self.healthy = False

    def release_requests(self) -> None:
        self._mark_ready()

    async def relaunch(self, gguf: Path, lora: Path | None) -> None:
        """Stop this server and start ``gguf`` in its place; call within ``exclusive``.

        Raises ServerStartError, leaving no process, when the new one fails."""
        await self._kill(hard=False)
        self.gguf, self.lora = gguf, lora
        await self._launch()

    async def drain(self, url: str) -> None:
        """Wait until no registered client has a request in flight on ``url``."""
        timeout = self.config.server.request_timeout_s
        deadline = time.monotonic() + timeout
        while count := self.in_flight(url):
            if time.monotonic() >= deadline:
                logger.warning(
                    "%d request(s) still in flight on %s after %.0f s "
                    "(server.request_timeout_s); stopping it anyway", count, url, timeout,
                )  # fmt: skip
                return
            await asyncio.sleep(_DRAIN_POLL_S)

    # -- internals: process

    async def _launch(self) -> None:
        self.kind.check(self.config, self.gguf)
        await self._kill(hard=True)  # reap a previous process that died on its own
        # A server left by a crashed earlier run of ours would hold the port.
        await asyncio.to_thread(orphans.stop_stale, self.pid_file)
        if await self.port_in_use():  # a stranger there would answer our probes as "ready"
            raise ServerStartError(f"port {self.port} on {self.host} is already in use. Fix: "
                                   "stop whatever listens there or set server.port to a free port.")
        argv = self.kind.command(self.config, self.gguf, self.host, self.port, self.lora)
        await asyncio.to_thread(self._open_log, argv)
        self.generation += 1
        with open(self.log_path, "ab") as log:
            # Tied to this thread by a parent-death signal: a crashed bot leaves no server.
            self._proc = orphans.popen_tied(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so killpg reaches all of it
            )
        orphans.record(self.pid_file, self._proc.pid, argv)
        logger.info(
            "started %s server pid %d on %s (log %s)",
            self.kind.name, self._proc.pid, self.base_url, self.log_path,
        )  # fmt: skip
        try:
            await self._await_ready()
        except BaseException:
            # Never leave a half-started server behind, even when cancelled.
            await self._kill(hard=True)
            raise

    def _open_log(self, argv: list[str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.log_path.exists() and self.log_path.stat().st_size > _LOG_ROTATE_BYTES:
            os.replace(self.log_path, self.log_path.with_suffix(".log.1"))
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(f"\n--- {stamp} nightshift starts: {' '.join(argv)}\n")

    async def port_in_use(self) -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 2)
        except (OSError, TimeoutError):
            return False
        writer.close()
        return True

    def exit_status(self) -> str | None:
        """How the process ended, or None while it runs. Peeks without reaping (WNOWAIT),
        so the pid, and with it the process group id, stays reserved until _kill reaps it."""
        if self._proc is None:
            return "is not running"
        if self._proc.returncode is not None:
            return f"exited with code {self._proc.returncode}"
        try:
            info = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return "exited"
        if info is None:
            return None
        if info.si_code == os.CLD_EXITED:
            return f"exited with code {info.si_status}"
        return f"was killed by signal {info.si_status}"

    async def _wait_exit(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.exit_status() is None:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_POLL_S / 4)
        return True

    async def _kill(self, *, hard: bool) -> None:
        if not self.kind.spawns or self._proc is None:
            return
        proc, pgid = self._proc, self._proc.pid  # session leader: pgid == pid
        if not hard and self.exit_status() is None:
            _signal_group(pgid, signal.SIGTERM)
            _signal_group(pgid, signal.SIGCONT)  # a stopped process acts on SIGTERM once continued
            if not await self._wait_exit(self.config.server.stop_grace_s):
                logger.warning(
                    "server pid %d ignored SIGTERM for %.0f s; sending SIGKILL",
                    pgid, self.config.server.stop_grace_s,
                )  # fmt: skip
        # Also sweeps any child left in the group; safe because the leader is not reaped yet.
        _signal_group(pgid, signal.SIGKILL)
        if not await self._wait_exit(30):
            logger.error("server pid %d survived SIGKILL for 30 s; leaving it", pgid)
            return
        await asyncio.to_thread(proc.wait)  # reap
        self._proc = None
        orphans.forget(self.pid_file)
        logger.info("server pid %d stopped", pgid)

    async def _restart_locked(self, reason: str, *, hard: bool) -> None:
        self._ready.clear()  # before the kill, so a request that fails on it waits for us
        self.healthy = False
        self.restarts += 1
        self.last_restart_reason = reason
        self._last_restart_at = time.monotonic()
        logger.warning("restarting the %s server at %s: %s", self.kind.name, self.base_url, reason)
        if self.kind.spawns:
            await self._kill(hard=hard)
            await self._launch()
        else:
            await self._await_ready()
        self._mark_ready()

    def _notice_death(self) -> None:
        # A crashed server is not ready, even before the watchdog's next round restarts it;
        # otherwise a client retrying after wait_ready() would spend its attempts at once.
        if self._ready.is_set() and self.kind.spawns and self.exit_status() is not None:
            self._ready.clear()
            self.healthy = False

    def _mark_ready(self) -> None:
        self.healthy = True
        self._ready.set()

    # -- internals: probing

    async def _await_ready(self) -> None:
        timeout = self.config.server.start_timeout_s
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            if self.kind.spawns and (status := self.exit_status()) is not None:
                raise ServerStartError(
                    f"the {self.kind.name} server {status} before it was ready.\n"
                    + await self._log_tail()
                )
            ok, last = await probe(self.config, self.base_url)
            if ok:
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"the {self.kind.name} server at {self.base_url} was not ready after "
                    f"{timeout:.0f} s (server.start_timeout_s); last probe: {last}.\n"
                    + await self._log_tail()
                )
            await asyncio.sleep(_POLL_S)

    async def _log_tail(self) -> str:
        return await log_tail(self.log_path) if self.kind.spawns else ""

    async def _cancel_watchdog(self) -> None:
        task, self._watchdog = self._watchdog, None
        if task is None or task is asyncio.current_task():
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise  # we were cancelled too, not just the watchdog
        except Exception:
            logger.exception("the server watchdog had failed")


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _free_port(host: str) -> int:
    """A port on ``host`` that nothing listened on a moment ago (``_launch`` checks again)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
