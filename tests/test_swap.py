"""Model swap with no lost request (serving.swap), and the LLM's in-flight count it drains on.

The fast tests use an OpenAI-compatible stub whose answers wait for a gate. The
``slow`` tests swap the real llama_cpp.server (tiny model, and a copy of it as
the "new" GGUF) while a client chats in a loop, and count its failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web

from core.config import Config
from core.model.served_at import served_url
from serving.client import LLM, LLMError
from serving.supervisor import ServerStartError, ServerSupervisor
from trainer.client import JsonClient

CHAT = [{"role": "user", "content": "Say hello."}]
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "nightshift",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                 "finish_reason": "stop"}],  # fmt: skip
}


def make_config(tmp_path: Path, port: int, **sections: dict) -> Config:
    raw: dict = {"paths": {"data_dir": str(tmp_path)}, "server": {"port": port}}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return Config.model_validate(raw)


async def until(condition: Callable[[], bool], timeout: float = 5) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def finish(task: asyncio.Task) -> None:
    """Cancel a task this test started and wait for it to end."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():
            raise
    except LLMError:
        pass


# ---------------------------------------------------------------- a gated stub server


class GatedServer:
    """Answers chats only once ``gate`` is set; canaries (max_tokens 1) and /models at once."""

    def __init__(self, status: int = 200) -> None:
        self.gate = asyncio.Event()
        self.status = status
        self.received = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "nightshift"}]})

    async def _chat(self, request: web.Request) -> web.Response:
        if (await request.json()).get("max_tokens") == 1:
            return web.json_response(ANSWER)
        self.received += 1
        await self.gate.wait()
        if self.status != 200:
            return web.json_response({"error": "no"}, status=self.status)
        return web.json_response(ANSWER)

    async def start(self) -> GatedServer:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
        return self

    async def stop(self) -> None:
        self.gate.set()
        await self._runner.cleanup()


@pytest.fixture
async def gated() -> AsyncIterator[Callable]:
    servers: list[GatedServer] = []

    async def make(status: int = 200) -> GatedServer:
        servers.append(await GatedServer(status).start())
        return servers[-1]

    yield make
    for server in servers:
        await server.stop()


async def external_supervisor(tmp_path: Path, url: str, **server: object) -> ServerSupervisor:
    config = make_config(tmp_path, 1, server={"kind": "external", "endpoint": url, **server})
    supervisor = ServerSupervisor(config)
    await supervisor.start(watchdog=False)
    return supervisor


# ---------------------------------------------------------------- in-flight accounting


async def test_a_request_counts_as_in_flight_on_its_url_until_it_is_answered(tmp_path, gated):
    server = await gated()
    async with LLM(make_config(tmp_path, 1), base_url=server.url) as llm:
        pending = asyncio.create_task(llm.chat(CHAT))
        await until(lambda: server.received == 1)
        assert llm.in_flight(server.url) == 1
        assert llm.in_flight(server.url + "/") == 1  # the trailing slash does not matter
        assert llm.in_flight("http://127.0.0.1:1/v1") == 0
        server.gate.set()
        assert (await pending).content == "hi"
        assert llm.in_flight(server.url) == 0


async def test_a_refused_request_leaves_the_in_flight_count(tmp_path, gated):
    server = await gated(status=400)
    server.gate.set()
    async with LLM(make_config(tmp_path, 1), base_url=server.url) as llm:
        with pytest.raises(LLMError, match="refused"):
            await llm.chat(CHAT)
        assert llm.in_flight(server.url) == 0


async def test_a_request_waiting_to_be_retried_is_not_in_flight(tmp_path, gated):
    server = await gated(status=503)
    server.gate.set()
    seen_while_waiting: list[int] = []

    class Supervisor:
        base_url = server.url

        async def wait_ready(self, timeout: float | None = None) -> None:
            seen_while_waiting.append(llm.in_flight(server.url))

    async with LLM(make_config(tmp_path, 1), Supervisor(), attempts=2, backoff_s=0) as llm:
        with pytest.raises(LLMError, match="failed 2 times"):
            await llm.chat(CHAT)
        assert seen_while_waiting == [0]  # a drain does not wait for it
        assert llm.in_flight(server.url) == 0


async def test_a_cancelled_request_leaves_the_in_flight_count(tmp_path, gated):
    server = await gated()
    async with LLM(make_config(tmp_path, 1), base_url=server.url) as llm:
        pending = asyncio.create_task(llm.chat(CHAT))
        await until(lambda: llm.in_flight(server.url) == 1)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        assert llm.in_flight(server.url) == 0


async def test_the_supervisor_counts_in_flight_over_every_registered_llm(tmp_path, gated):
    server = await gated()
    supervisor = await external_supervisor(tmp_path, server.url)
    async with LLM(supervisor.config, supervisor) as one, LLM(supervisor.config, supervisor) as two:
        tasks = [asyncio.create_task(llm.chat(CHAT)) for llm in (one, two, two)]
        await until(lambda: server.received == 3)
        assert supervisor.in_flight(server.url) == 3
        assert supervisor.in_flight(server.url + "/") == 3
        server.gate.set()
        await asyncio.gather(*tasks)
        assert supervisor.in_flight(server.url) == 0


async def test_the_drain_waits_for_requests_in_flight_then_returns(tmp_path, gated):
    server = await gated()
    supervisor = await external_supervisor(tmp_path, server.url)
    async with LLM(supervisor.config, supervisor) as llm:
        pending = asyncio.create_task(llm.chat(CHAT))
        await until(lambda: server.received == 1)
        drain = asyncio.create_task(supervisor.drain(server.url))
        await asyncio.sleep(0.3)
        assert not drain.done()
        server.gate.set()
        await asyncio.wait_for(drain, 2)
        assert (await pending).content == "hi"


async def test_the_drain_gives_up_after_the_request_timeout(tmp_path, gated, caplog):
    server = await gated()
    supervisor = await external_supervisor(tmp_path, server.url, request_timeout_s=0.5)
    patient = make_config(tmp_path, 1, server={"request_timeout_s": 10})  # outlasts the drain
    async with LLM(patient, supervisor, attempts=1) as llm:
        pending = asyncio.create_task(llm.chat(CHAT))
        await until(lambda: server.received == 1)
        started = time.monotonic()
        await asyncio.wait_for(supervisor.drain(server.url), 3)
        assert 0.4 < time.monotonic() - started < 2
        assert "still in flight" in caplog.text
        await finish(pending)


async def test_requests_queue_while_the_server_is_not_ready_and_go_out_once_it_is(
    tmp_path, gated
):
    server = await gated()
    server.gate.set()

    class Supervisor:
        base_url = server.url
        event = asyncio.Event()
        ready = property(lambda self: self.event.is_set())

        async def wait_ready(self, timeout: float | None = None) -> None:
            await asyncio.wait_for(self.event.wait(), timeout)

    supervisor = Supervisor()
    async with LLM(make_config(tmp_path, 1), supervisor) as llm:
        pending = asyncio.create_task(llm.chat(CHAT))
        await asyncio.sleep(0.3)
        assert server.received == 0 and not pending.done()  # queued, not sent and failed
        supervisor.event.set()
        assert (await asyncio.wait_for(pending, 5)).content == "hi"
        assert server.received == 1


# ---------------------------------------------------------------- refusals


async def test_an_external_server_cannot_be_swapped(tmp_path, gated):
    server = await gated()
    supervisor = await external_supervisor(tmp_path, server.url)
    with pytest.raises(ServerStartError, match="external cannot swap"):
        await supervisor.swap(tmp_path / "new.gguf")
    assert supervisor.ready


async def test_an_unknown_swap_mode_is_refused(tmp_path, free_port):
    supervisor = ServerSupervisor(make_config(tmp_path, free_port))
    with pytest.raises(ValueError, match="'hot' is unknown"):
        await supervisor.swap(tmp_path / "new.gguf", mode="hot")


async def test_a_missing_gguf_is_refused_before_anything_stops(tmp_path, free_port):
    supervisor = ServerSupervisor(make_config(tmp_path, free_port))
    old = supervisor.gguf
    with pytest.raises(ServerStartError, match="none.gguf does not exist"):
        await supervisor.swap(tmp_path / "none.gguf", mode="restart")
    assert supervisor.gguf == old and supervisor.generation == 0


# ---------------------------------------------------------------- the real server


class ChatLoop:
    """Chats through the LLM in a loop; records each answer and each failure."""

    def __init__(self, llm: LLM, supervisor: ServerSupervisor) -> None:
        self.llm, self.supervisor = llm, supervisor
        self.answers: list[tuple[float, float, bool]] = []  # (sent, answered, ready when sent)
        self.failures: list[Exception] = []

    async def run(self) -> None:
        while True:
            sent, ready = time.monotonic(), self.supervisor.ready
            try:
                await self.llm.chat(CHAT, max_tokens=3, temperature=0)
            except Exception as exc:  # any failure counts, whatever its kind
                self.failures.append(exc)
            else:
                self.answers.append((sent, time.monotonic(), ready))

    def answered_between(self, start: float, end: float) -> int:
        return sum(start <= answered <= end for _, answered, _ in self.answers)


@contextlib.asynccontextmanager
async def chatting(supervisor: ServerSupervisor) -> AsyncIterator[ChatLoop]:
    async with LLM(supervisor.config, supervisor, backoff_s=0.2) as llm:
        loop = ChatLoop(llm, supervisor)
        task = asyncio.create_task(loop.run(), name="test chat loop")
        try:
            await until(lambda: len(loop.answers) >= 2, timeout=30)
            yield loop
            count = len(loop.answers)
            await until(lambda: len(loop.answers) >= count + 2, timeout=30)  # still answering
        finally:
            await finish(task)


def serving(gguf: Path) -> list[int]:
    """Pids of processes whose command line names ``gguf``: stray servers."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.fsencode(gguf) in argv:
            pids.append(int(entry.name))
    return pids


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
async def live(tmp_path, free_port, served_gguf) -> AsyncIterator[ServerSupervisor]:
    """The real server under a watchdog, serving ``served_gguf``."""
    config = make_config(tmp_path, free_port, watchdog={"interval_s": 0.5, "restart_cooldown_s": 0})
    supervisor = ServerSupervisor(config, gguf=served_gguf)
    await supervisor.start()
    try:
        yield supervisor
    finally:
        await supervisor.stop()


@pytest.fixture
def new_gguf(tmp_path, served_gguf) -> Path:
    """The 'new' model: a copy of the served one under another name."""
    path = tmp_path / "models" / "new.gguf"
    path.parent.mkdir()
    try:
        os.link(served_gguf, path)
    except OSError:
        shutil.copy(served_gguf, path)
    return path


@pytest.mark.slow
async def test_a_blue_green_swap_loses_no_request_and_moves_to_a_new_process_and_port(
    live, new_gguf, caplog
):
    caplog.set_level(logging.WARNING)
    old_pid, old_port = live.pid, live.port
    assert served_url(live.config) == live.base_url  # recorded at start
    async with chatting(live) as loop:
        started = time.monotonic()
        await live.swap(new_gguf, reason="test")
        ended = time.monotonic()
    assert loop.failures == []
    assert "chat attempt" not in caplog.text  # not one request had to be retried
    assert loop.answered_between(started, ended) > 0  # the old server answered meanwhile
    assert live.gguf == new_gguf and live.ready and live.healthy
    assert live.pid not in (None, old_pid) and live.port != old_port
    assert live.base_url.endswith(f":{live.port}/v1")
    # A night started now (its own process) finds the new server, not the configured port.
    assert served_url(live.config) == live.base_url != live.config.base_url
    night = JsonClient.for_config(live.config)
    assert str(night._client.base_url).rstrip("/") == live.base_url
    await night.ask(CHAT, {"type": "object"}, max_tokens=8)  # ModelUnavailable if not there
    await night.close()
    assert not group_alive(old_pid)
    assert live.restarts == 0
    # The watchdog watches the new server: it restarts it, on its port, with its model.
    swapped_pid = live.pid
    os.kill(swapped_pid, signal.SIGKILL)
    await until(lambda: not live.ready)
    await live.wait_ready(30)
    assert live.restarts == 1 and live.pid not in (None, swapped_pid)
    assert live.gguf == new_gguf and live.port != old_port
    async with LLM(live.config, live) as llm:
        assert (await llm.chat(CHAT, max_tokens=2)).completion_tokens > 0


@pytest.mark.slow
async def test_a_restart_swap_delays_requests_during_the_gap_but_fails_none(live, new_gguf, caplog):
    caplog.set_level(logging.WARNING)
    old_pid, old_port = live.pid, live.port
    async with chatting(live) as loop:
        await live.swap(new_gguf, mode="restart", reason="test")
    assert loop.failures == []
    assert "chat attempt" not in caplog.text  # queued before sending, never sent and failed
    queued = [answered - sent for sent, answered, ready in loop.answers if not ready]
    assert queued, "no request was sent during the gap"
    assert live.gguf == new_gguf and live.ready and live.healthy
    assert live.pid not in (None, old_pid) and live.port == old_port
    assert not group_alive(old_pid)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["blue-green", "restart"])
async def test_a_corrupt_gguf_never_goes_live_and_the_old_model_keeps_serving(
    live, tmp_path, served_gguf, mode
):
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(os.urandom(4096))
    old_pid, old_port = live.pid, live.port
    async with chatting(live) as loop:
        with pytest.raises(ServerStartError) as caught:
            await live.swap(corrupt, mode=mode)
    message = str(caught.value)
    assert "corrupt.gguf" in message and "last lines" in message  # the server's log tail
    assert loop.failures == []
    assert live.gguf == served_gguf and live.port == old_port and live.ready
    if mode == "blue-green":
        assert "keeps serving" in message and live.pid == old_pid
    else:
        assert "started again" in message and live.pid not in (None, old_pid)
    assert serving(corrupt) == []
    async with LLM(live.config, live) as llm:
        assert (await llm.chat(CHAT, max_tokens=2)).completion_tokens > 0
