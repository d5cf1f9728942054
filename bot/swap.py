"""The model swap, with no lost request: blue/green, or a restart when memory is short.

blue/green (the default) needs memory for two models at once. A standby server
with the new GGUF starts on a second free port, with the same kind and
arguments, and must pass the canary. Then the supervisor takes over its process
in one synchronous step (``base_url``, ``port``, ``gguf``, ``pid``, the log), so
every ``LLM`` sends its next request there. The old server is drained (no
request in flight on its URL, for at most ``server.request_timeout_s``) and
stopped, SIGTERM then SIGKILL.

restart (one GPU, memory short) clears the ready event, so new requests queue
in the ``LLM``, which waits for ready before sending. The requests already in
flight drain, the old server stops, the new one starts on the same port, and
ready is set: the queued requests go out then.

A GGUF that fails to start or fails the canary never goes live. blue/green
leaves the old server serving, untouched; restart starts the old GGUF again.
Either way ``swap`` raises ``ServerStartError`` with the server's log tail.

Draining asks the clients: each ``LLM`` registers with its supervisor
(``register_client``) and counts its requests in flight per base URL. It does
so synchronously between reading ``base_url`` and sending, so once the
supervisor has moved, no request can still start on the old URL unseen.
Requests that bypass ``LLM`` (the canary) are not counted.

The supervisor's lock is held while the new server starts and takes over, so a
swap, a restart and a stop never overlap; the watchdog skips its rounds
meanwhile, as during any start. It watches whichever server is current. An
``external`` server is the user's to change: swapping it is refused.

This is the swap half of ``ServerSupervisor``, mixed into it to keep
``bot/server.py`` small; it uses the supervisor's process and ready state.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from pathlib import Path
from typing import Protocol

from bot.server_kinds import ServerStartError

logger = logging.getLogger("nightshift.server")

SWAP_MODES = ("blue-green", "restart")
_DRAIN_POLL_S = 0.05


class Client(Protocol):
    """What a supervisor asks the clients registered with it (``bot.llm.LLM``)."""

    def in_flight(self, url: str) -> int:
        """How many requests to ``url`` are sent and not yet answered."""


class Swapping:
    """Mixed into ``ServerSupervisor``: swap the served GGUF, and the drain registry."""

    def register_client(self, client: Client) -> None:
        """A swap waits for ``client``'s requests on a server before stopping it.

        Held weakly: a client that is garbage collected needs no unregistering."""
        self._clients.add(client)

    def in_flight(self, url: str) -> int:
        """Requests in flight on ``url`` over all registered clients."""
        url = url.rstrip("/")
        return sum(client.in_flight(url) for client in list(self._clients))

    async def swap(self, gguf: Path, *, mode: str = "blue-green", reason: str = "",
                   lora: Path | None = None) -> None:
        """Serve ``gguf`` instead of the current model; see the module docstring.

        Raises ServerStartError (the old model keeps serving) when the new one cannot
        start, ValueError for an unknown mode."""
        if mode not in SWAP_MODES:
            raise ValueError(f"swap mode {mode!r} is unknown; use one of {', '.join(SWAP_MODES)}")
        gguf = Path(gguf)
        if not self.kind.spawns:
            raise ServerStartError(
                f"server.kind = external cannot swap models: the server at {self.base_url} "
                f"is the user's. Fix: load {gguf} into it yourself, or let Nightshift run the "
                "server (server.kind = llama-cpp-python or llama-server)."
            )
        self.kind.check(self.config, gguf)  # a missing file fails before anything stops
        old = self.gguf
        why = f": {reason}" if reason else ""
        logger.warning("swapping the model %s -> %s (%s)%s", old, gguf, mode, why)
        if mode == "restart":
            await self._swap_restart(gguf, lora)
        else:
            await self._swap_blue_green(gguf, lora)
        logger.warning("swapped the model %s -> %s; serving at %s (pid %s)",
                       old, gguf, self.base_url, self.pid)  # fmt: skip

    async def _swap_blue_green(self, gguf: Path, lora: Path | None) -> None:
        async with self._lock:
            standby = type(self)(self.config, gguf=gguf, port=_free_port(self.host))
            standby.lora = lora
            try:
                await standby.start(watchdog=False)  # on any failure it leaves no process
            except ServerStartError as exc:
                raise ServerStartError(
                    f"the swap to {gguf} failed; {self.gguf} keeps serving at "
                    f"{self.base_url}.\n{exc}"
                ) from exc
            old_url = self.base_url
            self._exchange_process(standby)  # now the standby holds the old server
            self._mark_ready()
        try:
            await self._drain(old_url)
        finally:
            await standby.stop()  # also when cancelled: the old server must not linger

    async def _swap_restart(self, gguf: Path, lora: Path | None) -> None:
        async with self._lock:
            self._ready.clear()  # from here on new requests queue in the LLM
            self.healthy = False
            try:
                await self._drain(self.base_url)
            except BaseException:
                self._mark_ready()  # cancelled before anything stopped: the old one serves on
                raise
            await self._kill(hard=False)
            old, self.gguf = self.gguf, gguf
            old_lora, self.lora = self.lora, lora
            try:
                await self._launch()
            except ServerStartError as exc:
                self.gguf, self.lora = old, old_lora
                await self._start_again(old, gguf, exc)
                raise ServerStartError(
                    f"the swap to {gguf} failed; {old} was started again and serves at "
                    f"{self.base_url}.\n{exc}"
                ) from exc
            except BaseException:
                self.gguf, self.lora = old, old_lora  # cancelled mid-start: the watchdog restarts the model that worked
                raise
            self._mark_ready()

    async def _start_again(self, old: Path, new: Path, failure: ServerStartError) -> None:
        """Bring the old GGUF back after a failed restart-mode swap, and set ready."""
        try:
            await self._launch()
        except ServerStartError as again:
            raise ServerStartError(
                f"the swap to {new} failed, and starting {old} again failed too; no server "
                f"runs now and the watchdog keeps trying.\n{again}\n\nThe swap's failure:\n"
                f"{failure}"
            ) from failure
        self._mark_ready()

    def _exchange_process(self, other: Swapping) -> None:
        """Take over ``other``'s server and give it ours; synchronous, so it is one step."""
        self._proc, other._proc = other._proc, self._proc
        self.port, other.port = other.port, self.port
        self.gguf, other.gguf = other.gguf, self.gguf
        self.lora, other.lora = other.lora, self.lora
        self.log_path, other.log_path = other.log_path, self.log_path
        self.generation += 1

    async def _drain(self, url: str) -> None:
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


def _free_port(host: str) -> int:
    """A port on ``host`` that nothing listened on a moment ago (``_launch`` checks again)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
