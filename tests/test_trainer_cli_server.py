"""``python -m trainer sleep`` run by hand, with no bot serving: it serves the model itself.

A night resumed after the bot stopped failed at the gate ("the model server failed:
Connection error"): the judge and the open-chat check ask the served model. The CLI now
checks whether anything listens where the night will ask, and serves the live model for
the night's length when nothing does. Found by hand: ``make run``, ``!sleep``, end of
input killed by a timeout, then ``python -m trainer sleep --job 1``.
"""

from __future__ import annotations

import asyncio

from bot.config import Config
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
