"""Issue 11, part 4: a crashed bot leaves no model server holding the port.

The server here is ``tests/fake_llama_server.py`` (a real process answering the
probes), so that these tests measure the supervisor's process handling, not
llama.cpp's start-up time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from serving import orphans
from serving.supervisor import ServerSupervisor
from tests.fake_llama_server import FakeKind
from tests.test_server import make_config

ROOT = Path(__file__).resolve().parents[1]


def gone(pid: int, within_s: float = 10.0) -> bool:
    """True once ``pid`` has exited (a zombie, not reaped by init, counts as exited)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not orphans.running(pid):
            return True
        time.sleep(0.05)
    return False


def supervisor(tmp_path: Path, port: int) -> ServerSupervisor:
    sup = ServerSupervisor(make_config(tmp_path, port), gguf=tmp_path / "m.gguf")
    sup.kind = FakeKind()
    return sup


def kill_a_bot_serving(tmp_path: Path, port: int, gguf: Path | None) -> int:
    """Start a bot process whose supervisor serves ``gguf`` (the fake server if None),
    SIGKILL it once the server is ready, and return the server's pid."""
    make = (f"supervisor(Path({str(tmp_path)!r}), {port})" if gguf is None else
            f"ServerSupervisor(make_config(Path({str(tmp_path)!r}), {port}), gguf=Path({str(gguf)!r}))")
    bot = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import asyncio, sys, time
        from pathlib import Path
        from serving.supervisor import ServerSupervisor
        from tests.test_server import make_config
        from tests.test_server_orphans import supervisor

        async def main():
            sup = {make}
            await sup.start(watchdog=False)
            print(sup.pid, flush=True)
            time.sleep(600)  # a bot, busy, until the SIGKILL

        asyncio.run(main())
        """)], cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        server = int(bot.stdout.readline())
        assert orphans.cmdline(server) is not None
        os.kill(bot.pid, signal.SIGKILL)
        bot.wait()
        return server
    finally:
        bot.kill()
        bot.wait()


def test_a_bot_killed_with_sigkill_takes_its_server_with_it(tmp_path, free_port):
    server = kill_a_bot_serving(tmp_path, free_port, None)
    assert gone(server), "the server outlived the bot that started it"


@pytest.mark.slow
async def test_after_a_crash_the_real_server_is_gone_and_the_next_start_succeeds(
        tmp_path, free_port, served_gguf):
    server = kill_a_bot_serving(tmp_path, free_port, served_gguf)
    assert gone(server), "the llama.cpp server outlived the bot that started it"
    sup = ServerSupervisor(make_config(tmp_path, free_port), gguf=served_gguf)
    try:
        await sup.start(watchdog=False)  # the port is free again
        assert sup.ready
    finally:
        await sup.stop()


async def test_a_stale_server_of_ours_is_stopped_at_start(tmp_path, free_port):
    """The second guard: a server the parent-death signal missed (started without it here)
    but named in the pid file is killed, and the new one starts on the same port."""
    argv = FakeKind().command(None, None, "127.0.0.1", free_port)
    stale = subprocess.Popen(argv, start_new_session=True)
    sup = supervisor(tmp_path, free_port)
    orphans.record(sup.pid_file, stale.pid, argv)
    time.sleep(1.0)  # it listens on the port by now
    try:
        await sup.start(watchdog=False)  # before the fix: "port ... is already in use"
        assert stale.wait(timeout=10) == -signal.SIGKILL
        assert json.loads(sup.pid_file.read_text())["pid"] == sup.pid
    finally:
        await sup.stop()
        stale.kill()
        stale.wait()
    assert not sup.pid_file.exists()


def test_a_pid_file_naming_another_program_leaves_it_alone(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pid_file = tmp_path / "run" / "server-1.pid"
        orphans.record(pid_file, other.pid, [sys.executable, "-m", "core.model.shim"])
        assert orphans.stop_stale(pid_file) is None
        assert other.poll() is None and not pid_file.exists()
    finally:
        other.kill()
        other.wait()
