"""A wedged server: the real llama.cpp server stopped with SIGSTOP mid-conversation, and an
endpoint that accepts connections and never answers.

- SIGSTOP: the watchdog's canary must notice, kill the stopped server and start a new one;
  the turn sent meanwhile must end (answered after the restart, or with a clear error)
  within the watchdog's detection time plus a restart, and the next turn must be answered.
- A black hole: an external server is adopted while it answers, then replaced by a socket
  that accepts and reads but never writes. The turn must end with a clear error within the
  bound the config implies (attempts x (request timeout + wait for ready)), be stored as
  errored, and the bot must answer again once the server is back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from pathlib import Path

from bench.probes import Tally
from core.config import Config
from bot.runtime import Runtime
from serving.supervisor import ServerSupervisor
from tests.conftest import DEFAULT_GGUF
from tests.test_server import fake_openai_server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def base_config(work: Path) -> Config:
    config = Config()
    config.paths.data_dir = work / "data"
    config.agent.max_reply_tokens = 24
    config.agent.max_steps = 2
    config.agent.temperature = 0
    return config


async def timed_turn(rt: Runtime, channel: str, text: str, bound: float):
    """(result or exception, seconds); waits at most ``bound`` + 60 s, then gives up."""
    start = time.monotonic()
    try:
        result = await asyncio.wait_for(rt.turn(channel, text), bound + 60)
    except TimeoutError:
        result = f"no answer within {bound + 60:.0f} s"
    except Exception as exc:  # noqa: BLE001 - a turn that raised is the verdict
        result = repr(exc)
    return result, time.monotonic() - start


async def sigstop(tally: Tally, work: Path) -> None:
    config = base_config(work / "sigstop")
    config.server.port = free_port()
    config.server.request_timeout_s = 60
    config.watchdog.interval_s, config.watchdog.canary_timeout_s = 1.0, 3.0
    config.watchdog.failures_before_restart, config.watchdog.restart_cooldown_s = 2, 0
    rt = await Runtime.start(config, supervisor=ServerSupervisor(config, gguf=DEFAULT_GGUF))
    try:
        first, took = await timed_turn(rt, "c", "Say hello.", 120)
        tally.check("the real server answers before it is stopped", getattr(first, "ok", False),
                    first)
        old_pid = rt.supervisor.pid
        os.kill(old_pid, signal.SIGSTOP)
        detect = config.watchdog.failures_before_restart * (config.watchdog.interval_s
                                                            + config.watchdog.canary_timeout_s)
        bound = detect + 60 + 2 * took  # detection, a restart on a busy CPU, the turn itself
        result, seconds = await timed_turn(rt, "c", "Say hello again.", bound)
        clear = getattr(result, "ok", False) or "model server" in getattr(result, "reply", "")
        tally.check(f"the turn sent to the stopped server ends in bounded time "
                    f"({seconds:.0f} s <= {bound:.0f} s)", seconds <= bound and clear, result)
        tally.check("the watchdog restarted the server", rt.supervisor.restarts >= 1
                    and rt.supervisor.pid not in (None, old_pid), rt.supervisor.last_restart_reason)
        tally.check("the stopped server is gone", not group_alive(old_pid))
        after, _ = await timed_turn(rt, "c", "And once more.", 120)
        tally.check("the next turn is answered", getattr(after, "ok", False), after)
        tally.notes.append(f"SIGSTOP: the turn ended after {seconds:.1f} s "
                           f"(restart reason: {rt.supervisor.last_restart_reason[:60]})")
    finally:
        await rt.close()


async def black_hole(tally: Tally, work: Path) -> None:
    port = free_port()
    config = base_config(work / "hole")
    config.server.kind, config.server.endpoint = "external", f"http://127.0.0.1:{port}/v1"
    config.server.request_timeout_s, config.server.start_timeout_s = 3, 3
    config.server.stop_grace_s = 1
    config.watchdog.interval_s, config.watchdog.canary_timeout_s = 0.5, 1
    config.watchdog.failures_before_restart, config.watchdog.restart_cooldown_s = 1, 0
    answering = await fake_openai_server(port)
    rt = await Runtime.start(config)
    held: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read(1 << 20)  # read the request, answer nothing, never close

    hole = None
    try:
        ok, _ = await timed_turn(rt, "c", "hello", 30)
        tally.check("the external server answers before it wedges", getattr(ok, "ok", False), ok)
        await answering.cleanup()
        hole = await asyncio.start_server(never_answer, "127.0.0.1", port)
        s = config.server
        wait = s.request_timeout_s + s.stop_grace_s + 2 * s.start_timeout_s
        bound = 3 * (s.request_timeout_s + wait) + 5
        result, seconds = await timed_turn(rt, "c", "are you there?", bound)
        reply = getattr(result, "reply", "")
        tally.check(f"a turn against the black hole ends with a clear error ({seconds:.1f} s <= "
                    f"{bound:.0f} s)", seconds <= bound and not getattr(result, "ok", True)
                    and "the model server" in reply, result)
        episodes = await rt.store.episodes_since(0, "c")
        tally.check("the failed turn is stored as errored", episodes[-1].status == "errored",
                    [e.status for e in episodes])
        tally.check("the black hole got the requests (the probe's control)", len(held) >= 1)
        hole.close()
        for writer in held:
            writer.close()
        answering = await fake_openai_server(port)
        back, _ = await timed_turn(rt, "c", "and now?", 30)
        tally.check("the bot answers again once the server is back", getattr(back, "ok", False),
                    back)
        d, w = Config().server, Config().watchdog
        # The path taken: one request times out, the watchdog has marked the server away,
        # and the wait for it to be ready again times out.
        default = 2 * d.request_timeout_s + d.stop_grace_s + 2 * d.start_timeout_s \
            + w.restart_cooldown_s
        tally.notes.append(f"black hole: the turn ended after {seconds:.1f} s; with the default "
                           f"timeouts the same path takes {default:.0f} s")
    finally:
        if hole is not None:
            hole.close()
        await rt.close()
        await answering.cleanup()


async def run(tally: Tally, work: Path, quick: bool) -> None:
    await black_hole(tally, work)
    await sigstop(tally, work)
