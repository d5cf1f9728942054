"""serving.supervisor: command lines per kind, start/stop, the canary watchdog, start failures.

The ``slow`` tests run the real llama_cpp.server (through ``core.model.shim``)
with the tiny embedded model.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web

from core.config import Config
from serving.client import LLM
from serving.supervisor import (
    ServerNotReady,
    ServerStartError,
    ServerSupervisor,
    server_kind,
)
from serving.watchdog import _is_busy

CHAT = [{"role": "user", "content": "Say hello."}]


def make_config(tmp_path: Path, port: int, **sections: dict) -> Config:
    raw = {"paths": {"data_dir": str(tmp_path)}, "server": {"port": port}}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return Config.model_validate(raw)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# ---------------------------------------------------------------- command lines


def test_llama_cpp_python_command_serves_the_gguf_with_the_configured_settings(tmp_path):
    config = make_config(
        tmp_path, 9001,
        server={"threads": 2, "extra_args": ["--n_batch", "256"]},
        model={"alias": "nick", "context_tokens": 2048, "chat_format": "chatml"},
    )  # fmt: skip
    argv = server_kind("llama-cpp-python").command(config, Path("/m.gguf"), "127.0.0.1", 9001)
    assert argv[:3] == [sys.executable, "-m", "core.model.shim"]  # llama_cpp.server, unescaped
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags == {
        "--model": "/m.gguf",
        "--host": "127.0.0.1",
        "--port": "9001",
        "--chat_format": "chatml",
        "--n_ctx": "2048",
        "--model_alias": "nick",
        "--logits_all": "false",  # nothing reads prompt logits; they cost each cache save
        "--n_threads": "2",
        "--cache": "true",  # the prompt cache (core.model.prompt_cache), on by default
        "--cache_type": "ram",
        "--cache_size": str(1024 * 2**20),
        "--n_batch": "256",
    }


def test_llama_cpp_python_command_without_a_prompt_cache_when_its_size_is_zero(tmp_path):
    config = make_config(tmp_path, 9001, server={"prompt_cache_mb": 0})
    argv = server_kind("llama-cpp-python").command(config, Path("/m.gguf"), "127.0.0.1", 9001)
    assert "--cache" not in argv and "--cache_size" not in argv


def test_llama_cpp_python_command_leaves_threads_to_llama_cpp_by_default(tmp_path):
    argv = server_kind("llama-cpp-python").command(
        make_config(tmp_path, 9001), Path("/m.gguf"), "127.0.0.1", 9001
    )
    assert "--n_threads" not in argv


def test_llama_server_command_uses_the_binary_alias_and_jinja_template(tmp_path):
    config = make_config(
        tmp_path, 9002, server={"kind": "llama-server", "binary": "/opt/llama-server", "threads": 4},
        model={"context_tokens": 4096},
    )
    argv = server_kind("llama-server").command(config, Path("/m.gguf"), "127.0.0.1", 9002)
    assert argv[0] == "/opt/llama-server"
    for flag, value in [("-m", "/m.gguf"), ("--port", "9002"), ("-c", "4096"),
                        ("--alias", "nightshift"), ("-t", "4")]:  # fmt: skip
        assert argv[argv.index(flag) + 1] == value
    assert "--jinja" in argv


def test_the_watchdog_counts_a_timeout_as_busy_only_while_the_server_computes():
    assert _is_busy("canary timed out after 2 s", cpu_used=1.5)
    assert not _is_busy("canary timed out after 2 s", cpu_used=0.0)  # SIGSTOP, deadlock
    assert not _is_busy("canary: ConnectError: refused", cpu_used=1.5)


# ---------------------------------------------------------------- failures before spawning


async def test_a_missing_gguf_is_refused_before_anything_starts(tmp_path, free_port):
    supervisor = ServerSupervisor(make_config(tmp_path, free_port), gguf=tmp_path / "none.gguf")
    with pytest.raises(ServerStartError, match="none.gguf does not exist"):
        await supervisor.start()
    assert supervisor.pid is None and not supervisor.ready


async def test_a_busy_port_is_refused_rather_than_probed(tmp_path, free_port):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with socket.create_server(("127.0.0.1", free_port)):
        supervisor = ServerSupervisor(make_config(tmp_path, free_port), gguf=gguf)
        with pytest.raises(ServerStartError, match=f"port {free_port} .* already in use"):
            await supervisor.start()
    assert supervisor.pid is None


async def test_wait_ready_times_out_with_a_clear_error(tmp_path, free_port):
    supervisor = ServerSupervisor(make_config(tmp_path, free_port))
    with pytest.raises(ServerNotReady, match="not ready within 0.05 s"):
        await supervisor.wait_ready(0.05)


# ---------------------------------------------------------------- external kind


async def fake_openai_server(port: int) -> web.AppRunner:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "nightshift"}]})

    async def chat(request: web.Request) -> web.Response:
        message = {"role": "assistant", "content": "OK"}
        return web.json_response({"choices": [{"index": 0, "message": message}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def test_the_external_kind_only_probes_and_never_spawns(tmp_path, free_port, monkeypatch):
    def no_spawn(*args, **kwargs):
        raise AssertionError("an external server must never be spawned")

    monkeypatch.setattr(subprocess, "Popen", no_spawn)
    endpoint = f"http://127.0.0.1:{free_port}/v1"
    config = make_config(tmp_path, 1, server={"kind": "external", "endpoint": endpoint})
    runner = await fake_openai_server(free_port)
    try:
        supervisor = ServerSupervisor(config)
        await supervisor.start()
        assert supervisor.ready and supervisor.healthy
        assert supervisor.base_url == endpoint and supervisor.pid is None
        await supervisor.restart("manual")
        await supervisor.stop()
        assert not supervisor.ready
    finally:
        await runner.cleanup()


async def test_an_unresponsive_external_server_makes_requests_wait_until_it_answers(
    tmp_path, free_port
):
    endpoint = f"http://127.0.0.1:{free_port}/v1"
    config = make_config(
        tmp_path, 1,
        server={"kind": "external", "endpoint": endpoint},
        watchdog={"interval_s": 0.05, "canary_timeout_s": 1, "failures_before_restart": 1},
    )  # fmt: skip
    runner = await fake_openai_server(free_port)
    supervisor = ServerSupervisor(config)
    try:
        await supervisor.start()
        await runner.cleanup()  # the user's server goes away
        async with asyncio.timeout(5):
            while supervisor.ready:
                await asyncio.sleep(0.02)
        assert supervisor.restarts == 0 and not supervisor.healthy
        runner = await fake_openai_server(free_port)
        await supervisor.wait_ready(5)
        assert supervisor.healthy
    finally:
        await supervisor.stop()
        await runner.cleanup()


# ---------------------------------------------------------------- the real server


@pytest.mark.slow
async def test_the_real_server_starts_answers_a_chat_and_stops_cleanly(
    tmp_path, free_port, served_gguf, caplog
):
    supervisor = ServerSupervisor(make_config(tmp_path, free_port), gguf=served_gguf)
    await supervisor.start()
    pid = supervisor.pid
    try:
        assert pid is not None and supervisor.ready and supervisor.healthy
        assert os.getpgid(pid) == pid  # its own process group
        async with LLM(supervisor.config, supervisor) as llm:
            reply = await llm.chat(CHAT, max_tokens=8, temperature=0)
        assert reply.completion_tokens > 0 and reply.model
        assert supervisor.log_path.is_file()
    finally:
        await supervisor.stop()
    assert supervisor.pid is None and not supervisor.ready
    assert not group_alive(pid)
    assert "ignored SIGTERM" not in caplog.text  # it stopped gracefully, within the grace


@pytest.mark.slow
async def test_the_watchdog_restarts_a_hung_server_and_the_pending_request_succeeds(
    tmp_path, free_port, served_gguf
):
    interval, canary_timeout, k = 1.0, 2.0, 2
    config = make_config(
        tmp_path, free_port,
        watchdog={"interval_s": interval, "canary_timeout_s": canary_timeout,
                  "failures_before_restart": k, "restart_cooldown_s": 0},
        server={"request_timeout_s": 60},
    )  # fmt: skip
    supervisor = ServerSupervisor(config, gguf=served_gguf)
    await supervisor.start()
    old_pid = supervisor.pid
    try:
        async with LLM(config, supervisor, backoff_s=0.2) as llm:
            os.kill(old_pid, signal.SIGSTOP)
            hung_at = time.monotonic()
            # Sent to the stopped server: it must ride out the restart, not fail.
            pending = asyncio.create_task(llm.chat(CHAT, max_tokens=4, temperature=0))
            startup_slack = 30
            deadline = hung_at + k * (interval + canary_timeout) + startup_slack
            while supervisor.restarts == 0 or not supervisor.ready:
                assert time.monotonic() < deadline, "the watchdog did not restart the server"
                await asyncio.sleep(0.1)
            assert supervisor.pid not in (None, old_pid)
            assert "canary" in supervisor.last_restart_reason
            assert not group_alive(old_pid)
            reply = await asyncio.wait_for(pending, 30)
            assert reply.completion_tokens > 0
            after = await llm.chat(CHAT, max_tokens=4, temperature=0)
            assert after.completion_tokens > 0
    finally:
        await supervisor.stop()
    assert supervisor.restarts == 1


@pytest.mark.slow
async def test_the_watchdog_restarts_a_server_that_died(tmp_path, free_port, served_gguf):
    config = make_config(tmp_path, free_port, watchdog={"interval_s": 3, "restart_cooldown_s": 0})
    supervisor = ServerSupervisor(config, gguf=served_gguf)
    await supervisor.start()
    try:
        old_pid = supervisor.pid
        os.kill(old_pid, signal.SIGKILL)
        # Known as soon as the kernel has ended it, before the watchdog's round (3 s away);
        # on a loaded machine ending a many-threaded process takes a moment.
        deadline = time.monotonic() + 2
        while supervisor.ready and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not supervisor.ready
        await supervisor.wait_ready(30)
        assert supervisor.restarts == 1 and supervisor.pid not in (None, old_pid)
        assert "killed by signal 9" in supervisor.last_restart_reason
    finally:
        await supervisor.stop()


@pytest.mark.slow
async def test_a_corrupt_gguf_fails_start_with_an_error_naming_the_log(tmp_path, free_port):
    gguf = tmp_path / "corrupt.gguf"
    gguf.write_bytes(os.urandom(4096))
    supervisor = ServerSupervisor(make_config(tmp_path, free_port), gguf=gguf)
    with pytest.raises(ServerStartError) as caught:
        await supervisor.start()
    message = str(caught.value)
    assert "before it was ready" in message
    assert str(supervisor.log_path) in message
    assert "corrupt.gguf" in message  # the log tail shows the server's own complaint
    assert supervisor.pid is None and not supervisor.ready
