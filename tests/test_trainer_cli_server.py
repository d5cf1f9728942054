"""``python -m trainer sleep`` run by hand, with no bot serving: it serves the model itself.

A night resumed after the bot stopped failed at the gate ("the model server failed:
Connection error"): the judge and the open-chat check ask the served model. The CLI now
checks whether anything listens where the night will ask, and serves the live model for
the night's length when nothing does. Found by hand: ``make run``, ``!sleep``, end of
input killed by a timeout, then ``python -m trainer sleep --job 1``.
"""

from __future__ import annotations

import asyncio

import pytest

from core.config import Config
from trainer.__main__ import _answers


def _config(port: int, kind: str = "llama-cpp-python") -> Config:
    config = Config()
    config.server.port = port
    if kind == "external":
        config.server.kind = "external"
        config.server.endpoint = f"http://127.0.0.1:{port}/v1"
    return config


def test_answers_sees_a_listener_and_its_absence():
    async def run() -> tuple[bool, bool]:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            listening = await _answers(_config(port))
        finally:
            server.close()
            await server.wait_closed()
        return listening, await _answers(_config(port))

    listening, after = asyncio.run(run())
    assert listening is True
    assert after is False  # the port is closed again: the CLI would serve the model itself


def test_an_external_endpoint_is_never_started_here(free_port):
    # Not ours to start: an unreachable external endpoint fails the night, resumable.
    assert asyncio.run(_answers(_config(free_port, kind="external"))) is True


def test_a_night_the_bot_starts_never_serves_its_own(tmp_path, monkeypatch):
    # The bot's server may be restarting (the watchdog) or paused (night.single_gpu) just
    # as the night starts: a second server on its port would then take the port from it.
    import subprocess

    import trainer.__main__ as cli
    from bot.night import jobs

    launched: list[list[str]] = []
    popen = subprocess.Popen  # jobs.subprocess is this module: keep the real one
    monkeypatch.setattr(jobs.subprocess, "Popen",
                        lambda argv, **kwargs: launched.append(argv) or popen(["true"]))
    config = Config()
    config.paths.data_dir = tmp_path
    jobs.start_trainer(config, 7).wait()
    told: list[tuple] = []

    class Told(Exception):
        pass

    async def night(config, job, since, bot_serves=False):
        told.append((job, bot_serves))
        raise Told  # the night itself is not this test's: only what the CLI was told

    monkeypatch.setattr(cli, "_night_with_server", night)
    argv = launched[0][launched[0].index("trainer") + 1:]
    with pytest.raises(Told):
        cli.main(argv)
    assert told == [(7, True)]
