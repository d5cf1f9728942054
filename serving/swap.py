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

The strategies live here, beside ``serving.supervisor`` that calls them, and act on
it through ``serving.served.Served`` only: its lock, standby, switch and drain.
"""

from __future__ import annotations

import logging
from pathlib import Path

from serving.kinds import ServerStartError
from serving.served import Served

logger = logging.getLogger("nightshift.server")

SWAP_MODES = ("blue-green", "restart")


async def swap(sup: Served, gguf: Path, *, mode: str = "blue-green", reason: str = "",
               lora: Path | None = None) -> None:
    """Serve ``gguf`` instead of the current model; see the module docstring.

    Raises ServerStartError (the old model keeps serving) when the new one cannot
    start, ValueError for an unknown mode."""
    if mode not in SWAP_MODES:
        raise ValueError(f"swap mode {mode!r} is unknown; use one of {', '.join(SWAP_MODES)}")
    gguf = Path(gguf)
    if not sup.kind.spawns:
        raise ServerStartError(
            f"server.kind = external cannot swap models: the server at {sup.base_url} "
            f"is the user's. Fix: load {gguf} into it yourself, or let Nightshift run the "
            "server (server.kind = llama-cpp-python or llama-server)."
        )
    sup.kind.check(sup.config, gguf)  # a missing file fails before anything stops
    old = sup.gguf
    why = f": {reason}" if reason else ""
    logger.warning("swapping the model %s -> %s (%s)%s", old, gguf, mode, why)
    if mode == "restart":
        await _restart(sup, gguf, lora)
    else:
        await _blue_green(sup, gguf, lora)
    logger.warning("swapped the model %s -> %s; serving at %s (pid %s)",
                   old, gguf, sup.base_url, sup.pid)  # fmt: skip


async def _blue_green(sup: Served, gguf: Path, lora: Path | None) -> None:
    async with sup.exclusive():
        try:
            standby = await sup.start_standby(gguf, lora)  # on any failure it leaves no process
        except ServerStartError as exc:
            raise ServerStartError(
                f"the swap to {gguf} failed; {sup.gguf} keeps serving at "
                f"{sup.base_url}.\n{exc}"
            ) from exc
        old_url = sup.base_url
        sup.switch_to(standby)  # now the standby holds the old server
    try:
        await sup.drain(old_url)
    finally:
        await standby.stop()  # also when cancelled: the old server must not linger


async def _restart(sup: Served, gguf: Path, lora: Path | None) -> None:
    async with sup.exclusive():
        sup.hold_requests()  # from here on new requests queue in the LLM
        try:
            await sup.drain(sup.base_url)
        except BaseException:
            sup.release_requests()  # cancelled before anything stopped: the old one serves on
            raise
        old, old_lora = sup.gguf, sup.lora
        try:
            await sup.relaunch(gguf, lora)
        except ServerStartError as exc:
            await _start_again(sup, old, old_lora, gguf, exc)
            raise ServerStartError(
                f"the swap to {gguf} failed; {old} was started again and serves at "
                f"{sup.base_url}.\n{exc}"
            ) from exc
        except BaseException:
            # Cancelled mid-start: the watchdog restarts the model that worked.
            sup.gguf, sup.lora = old, old_lora
            raise
        sup.release_requests()


async def _start_again(sup: Served, old: Path, old_lora: Path | None, new: Path,
                       failure: ServerStartError) -> None:
    """Bring the old GGUF back after a failed restart-mode swap, and release requests."""
    try:
        await sup.relaunch(old, old_lora)
    except ServerStartError as again:
        raise ServerStartError(
            f"the swap to {new} failed, and starting {old} again failed too; no server "
            f"runs now and the watchdog keeps trying.\n{again}\n\nThe swap's failure:\n"
            f"{failure}"
        ) from failure
    sup.release_requests()
