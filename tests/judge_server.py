"""A deterministic scripted OpenAI-compatible server for the night's tests.

``answer(kind, body)`` returns the JSON the "model" says for a request, where
kind is the response_format's schema title (judge_report, value_prediction,
understanding). Returning an int sends that HTTP status instead.
"""

from __future__ import annotations

import json
from typing import Callable

from aiohttp import web


class JudgeServer:
    def __init__(self, answer: Callable[[str, dict], object]) -> None:
        self.answer = answer
        self.requests: list[tuple[str, dict]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        kind = (body.get("response_format") or {}).get("schema", {}).get("title", "")
        self.requests.append((kind, body))
        out = self.answer(kind, body)
        if isinstance(out, int):
            return web.json_response({"error": "scripted failure"}, status=out)
        content = out if isinstance(out, str) else json.dumps(out)
        return web.json_response({
            "id": "x", "object": "chat.completion", "created": 0, "model": "judge",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    async def start(self) -> JudgeServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def of(self, kind: str) -> list[dict]:
        return [body for k, body in self.requests if k == kind]
