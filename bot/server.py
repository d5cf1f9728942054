"""Supervisor for the local llama.cpp server, with a canary watchdog.

The supervisor starts the server in its own session (so one signal reaches the
whole process group), sends its output to a log file under
``data_dir/logs``, and calls it ready only after ``GET /v1/models`` answers
*and* a one-token chat completion (the canary) succeeds: llama.cpp can answer
its health routes while generation is wedged, so only a real completion counts.

The watchdog repeats the canary every ``watchdog.interval_s``. After
``failures_before_restart`` consecutive failures it kills the process group
and starts a fresh server, at most once per ``restart_cooldown_s``. While it
restarts, the ready event is cleared so that ``bot.llm`` waits instead of
failing. A canary that times out while the server is burning CPU is counted as
"busy" (a long generation holds llama.cpp's single slot) rather than as a
failure, but only for up to ``server.request_timeout_s``: no legitimate request
runs longer than that, so a server spinning for longer is restarted too.

Server kinds sit behind the small ``ServerKind`` protocol: ``llama-cpp-python``
(``python -m llama_cpp.server`` through ``bot.llama_shim``, which turns off
the chat template's HTML escaping), ``llama-server`` (llama.cpp's binary) and
``external`` (started by the user; we only probe it and never signal it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
import weakref
from pathlib import Path

import httpx

from bot.config import Config

logger = logging.getLogger("nightshift.server")

_POLL_S = 0.2  # how often start() probes and stop() checks for exit
_MODELS_TIMEOUT_S = 2.0
_LOG_TAIL_LINES = 25
_LOG_ROTATE_BYTES = 10 * 1024 * 1024
_BUSY_CPU_S = 0.05  # CPU seconds over a canary window that mean "working, not wedged"


from bot.server_kinds import (  # noqa: E402 - re-exported for callers of bot.server
    SERVER_KINDS,
    ServerKind,
    ServerNotReady,
    ServerStartError,
    server_kind,
)
from bot.swap import SWAP_MODES, Swapping  # noqa: E402

__all__ = ["SERVER_KINDS", "SWAP_MODES", "ServerKind", "ServerNotReady", "ServerStartError",
           "ServerSupervisor", "server_kind"]


# ---------------------------------------------------------------- supervisor


class ServerSupervisor(Swapping):
    """Owns one server process (or, for ``external``, one endpoint) and its watchdog.

    ``swap`` (from ``bot.swap``) replaces the served GGUF without losing a request."""

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
        self.restarts = 0
        self.last_restart_reason: str | None = None
        self._proc: subprocess.Popen | None = None
        self._ready = asyncio.Event()
        self._lock = asyncio.Lock()  # one start/stop/restart/swap at a time
        self._watchdog: asyncio.Task | None = None
        self._last_restart_at = float("-inf")
        self.generation = 0  # counts the processes we served; the watchdog notices a new one
        self._clients: weakref.WeakSet = weakref.WeakSet()  # asked before a swap stops a server

    # -- state

    @property
    def base_url(self) -> str:
        if not self.kind.spawns:
            return self.config.base_url
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._exit_status() is None else None

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

    async def restart(self, reason: str, *, hard: bool = False) -> None:
        """Stop and start again; ``hard`` skips SIGTERM (a wedged server ignores it)."""
        async with self._lock:
            await self._restart_locked(reason, hard=hard)

    def start_watchdog(self) -> None:
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(self._watch(), name=f"watchdog:{self.port}")

    # -- internals: process

    async def _launch(self) -> None:
        self.kind.check(self.config, self.gguf)
        await self._kill(hard=True)  # reap a previous process that died on its own
        await self._check_port_free()
        argv = self.kind.command(self.config, self.gguf, self.host, self.port, self.lora)
        await asyncio.to_thread(self._open_log, argv)
        self.generation += 1
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so killpg reaches all of it
            )
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

    async def _check_port_free(self) -> None:
        # Otherwise a stranger already on the port would answer our probes and pass as "ready".
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 2)
        except (OSError, TimeoutError):
            return
        writer.close()
        raise ServerStartError(
            f"port {self.port} on {self.host} is already in use. "
            "Fix: stop whatever listens there or set server.port to a free port."
        )

    def _exit_status(self) -> str | None:
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
        while self._exit_status() is None:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_POLL_S / 4)
        return True

    async def _kill(self, *, hard: bool) -> None:
        if not self.kind.spawns or self._proc is None:
            return
        proc, pgid = self._proc, self._proc.pid  # session leader: pgid == pid
        if not hard and self._exit_status() is None:
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
        if self._ready.is_set() and self.kind.spawns and self._exit_status() is not None:
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
            if self.kind.spawns and (status := self._exit_status()) is not None:
                raise ServerStartError(
                    f"the {self.kind.name} server {status} before it was ready.\n"
                    + await self._log_tail()
                )
            ok, last = await self._probe()
            if ok:
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"the {self.kind.name} server at {self.base_url} was not ready after "
                    f"{timeout:.0f} s (server.start_timeout_s); last probe: {last}.\n"
                    + await self._log_tail()
                )
            await asyncio.sleep(_POLL_S)

    async def _probe(self) -> tuple[bool, str]:
        """``GET /models``, then the canary; returns (ok, what went wrong)."""
        try:
            async with httpx.AsyncClient(timeout=_MODELS_TIMEOUT_S, trust_env=False) as http:
                response = await http.get(f"{self.base_url}/models")
        except httpx.HTTPError as exc:
            return False, f"GET /models: {type(exc).__name__}"
        if response.status_code != 200:
            return False, f"GET /models answered {response.status_code}"
        return await self._canary()

    async def _canary(self) -> tuple[bool, str]:
        """A one-token chat completion under ``watchdog.canary_timeout_s``."""
        timeout = self.config.watchdog.canary_timeout_s
        body = {
            "model": self.config.model.alias,
            "messages": [{"role": "user", "content": "Say OK."}],
            "max_tokens": 1,
            "temperature": 0,
        }
        try:
            async with httpx.AsyncClient(timeout=timeout, trust_env=False) as http:
                response = await asyncio.wait_for(
                    http.post(f"{self.base_url}/chat/completions", json=body), timeout
                )
        except (httpx.TimeoutException, TimeoutError):
            return False, f"canary timed out after {timeout} s"
        except httpx.HTTPError as exc:
            return False, f"canary: {type(exc).__name__}: {exc}"
        if response.status_code != 200:
            return False, f"canary answered {response.status_code}: {response.text[:200]}"
        try:
            response.json()["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            return False, f"canary answered without choices: {response.text[:200]}"
        return True, "ok"

    async def _log_tail(self) -> str:
        if not self.kind.spawns:
            return ""

        def read() -> str:
            try:
                with open(self.log_path, "rb") as log:
                    log.seek(max(0, log.seek(0, os.SEEK_END) - 8192))
                    text = log.read().decode("utf-8", "replace")
            except OSError as exc:
                return f"(cannot read it: {exc})"
            return "\n".join(text.splitlines()[-_LOG_TAIL_LINES:])

        return f"Server log {self.log_path}, last lines:\n{await asyncio.to_thread(read)}"

    # -- internals: watchdog

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

    async def _watch(self) -> None:
        dog = self.config.watchdog
        failures, busy_since, generation = 0, None, self.generation
        while True:
            await asyncio.sleep(dog.interval_s)
            if self._lock.locked():
                continue  # a start, stop, restart or swap is under way; it probes for itself
            if self.generation != generation:  # another process now: judge it afresh
                failures, busy_since, generation = 0, None, self.generation
            try:
                failures, busy_since = await self._watch_once(failures, busy_since)
            except ServerStartError as exc:
                # Keep watching: the next failures trigger another try after the cooldown.
                logger.error("watchdog restart failed: %s", exc)
                failures = 0
            except Exception:
                logger.exception("watchdog check failed")

    async def _watch_once(
        self, failures: int, busy_since: float | None
    ) -> tuple[int, float | None]:
        """One canary round; returns the new (consecutive failures, busy since)."""
        dog = self.config.watchdog
        generation = self.generation
        status = self._exit_status() if self.kind.spawns else None
        if status is not None:
            why, failures = f"the server process {status}", dog.failures_before_restart
        else:
            cpu_before = _cpu_seconds(self.pid)
            ok, why = await self._canary()
            if self._lock.locked() or self.generation != generation:
                # A start, stop, restart or swap began meanwhile and owns the ready state;
                # marking it ready now would let requests through mid-swap.
                return failures, busy_since
            if ok:
                if not self.healthy:
                    logger.info("server at %s answers the canary again", self.base_url)
                self._mark_ready()
                return 0, None
            cpu_used = _cpu_seconds(self.pid) - cpu_before
            now = time.monotonic()
            busy_for = now - (busy_since or now)
            if _is_busy(why, cpu_used) and busy_for < self.config.server.request_timeout_s:
                logger.info("canary: %s, but the server is computing; counted as busy", why)
                return failures, busy_since or now
            failures += 1
        self.healthy = False
        logger.warning("canary failed (%d/%d): %s", failures, dog.failures_before_restart, why)
        if failures < dog.failures_before_restart:
            return failures, busy_since
        if not self.kind.spawns:
            # We cannot restart someone else's server; make requests wait for it instead.
            self._ready.clear()
            logger.error("the external server at %s is unresponsive: %s", self.base_url, why)
            return failures, busy_since
        cooldown_left = self._last_restart_at + dog.restart_cooldown_s - time.monotonic()
        if cooldown_left > 0:
            logger.warning("restart deferred: %.0f s of restart cooldown left", cooldown_left)
            return failures, busy_since
        reason = f"{failures} consecutive canary failures; last: {why}"
        async with self._lock:
            if self.generation != generation:
                return 0, None  # a swap replaced the server while we probed the old one
            await self._restart_locked(reason, hard=True)
        return 0, None


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


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # already gone
