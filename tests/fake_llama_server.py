"""A stand-in model server process: answers /v1/models and a one-token chat (the canary).

``python tests/fake_llama_server.py PORT``. For tests of the process side of the
supervisor (pid files, parent-death signals), where a real llama.cpp server would
only add start-up time. ``FakeKind`` makes a supervisor start it.
"""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve()


class FakeKind:
    name = "fake"
    spawns = True

    def check(self, config, gguf) -> None:
        return None

    def command(self, config, gguf, host, port, lora=None) -> list[str]:
        return [sys.executable, str(SCRIPT), str(port)]


def main() -> None:
    from aiohttp import web

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "fake"}]})

    async def chat(request):
        message = {"role": "assistant", "content": "OK"}
        return web.json_response({"choices": [{"index": 0, "message": message,
                                               "finish_reason": "stop"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)


if __name__ == "__main__":
    main()
