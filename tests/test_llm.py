"""serving.client against a scripted OpenAI-compatible server (aiohttp, in the test's loop)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from core.config import Config
from serving.client import LLM, LLMError, Reply


def completion(content: str | None = "hi", tool_calls: list | None = None) -> dict:
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "nightshift",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    }


class ScriptedServer:
    """Answers /v1/chat/completions with canned (status, body) pairs, in order; the last repeats."""

    def __init__(self, script: list[tuple[int, dict]]) -> None:
        self.script = list(script)
        self.requests: list[dict] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _chat(self, request: web.Request) -> web.Response:
        self.requests.append(await request.json())
        status, body = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return web.json_response(body, status=status)

    async def start(self, port: int = 0) -> ScriptedServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


class FakeSupervisor:
    """Counts wait_ready calls; ``on_wait`` simulates what a restart does (e.g. a new URL)."""

    def __init__(self, base_url: str, on_wait=None) -> None:
        self.base_url = base_url
        self.waits = 0
        self.on_wait = on_wait

    async def wait_ready(self, timeout: float | None = None) -> None:
        self.waits += 1
        if self.on_wait is not None:
            await self.on_wait(self)


@pytest.fixture
async def scripted():
    servers: list[ScriptedServer] = []

    async def make(script: list[tuple[int, dict]], port: int = 0) -> ScriptedServer:
        server = await ScriptedServer(script).start(port)
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.stop()


def config() -> Config:
    return Config.model_validate({"server": {"request_timeout_s": 5}})


async def test_tool_calls_are_parsed_into_the_reply_with_raw_arguments(scripted):
    raw = '{"path": "notes.md", "text": "a'  # truncated JSON stays as the model wrote it
    calls = [{"id": "call_1", "type": "function", "function": {"name": "write", "arguments": raw}}]
    server = await scripted([(200, completion(None, calls))])
    async with LLM(config(), base_url=server.url) as llm:
        reply = await llm.chat([{"role": "user", "content": "save it"}])
    assert isinstance(reply, Reply)
    assert reply.content == ""
    assert reply.tool_calls == calls
    assert reply.finish_reason == "tool_calls"
    assert (reply.prompt_tokens, reply.completion_tokens) == (11, 3)
    assert reply.model == "nightshift"
    assert reply.duration_ms > 0


async def test_request_carries_tools_response_format_limits_and_extra_keywords(scripted):
    server = await scripted([(200, completion("ok"))])
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    async with LLM(config(), base_url=server.url) as llm:
        reply = await llm.chat(
            [{"role": "user", "content": "q"}],
            tools=tools, response_format=schema, max_tokens=7, temperature=0.0, seed=3,
        )  # fmt: skip
    assert reply.content == "ok"
    body = server.requests[0]
    assert body["model"] == "nightshift"
    assert body["tools"] == tools and body["response_format"] == schema
    assert (body["max_tokens"], body["temperature"], body["seed"]) == (7, 0.0, 3)


async def test_unset_options_are_not_sent(scripted):
    server = await scripted([(200, completion("ok"))])
    async with LLM(config(), base_url=server.url) as llm:
        await llm.chat([{"role": "user", "content": "q"}])
    assert set(server.requests[0]) == {"model", "messages"}


async def test_a_503_is_retried_after_wait_ready_and_then_succeeds(scripted):
    server = await scripted([(503, {"error": "loading"}), (200, completion("back"))])
    supervisor = FakeSupervisor(server.url)
    async with LLM(config(), supervisor, backoff_s=0) as llm:
        reply = await llm.chat([{"role": "user", "content": "q"}])
    assert reply.content == "back"
    assert supervisor.waits == 1
    assert len(server.requests) == 2


async def test_connection_refused_is_retried_on_the_supervisors_new_url(scripted, free_port):
    # The first URL has no listener (a server mid-restart); wait_ready "restarts" it elsewhere,
    # as a blue/green swap would, and the client must follow the new base_url.
    async def restart(supervisor: FakeSupervisor) -> None:
        server = await scripted([(200, completion("new port"))])
        supervisor.base_url = server.url

    supervisor = FakeSupervisor(f"http://127.0.0.1:{free_port}/v1", on_wait=restart)
    async with LLM(config(), supervisor, backoff_s=0) as llm:
        reply = await llm.chat([{"role": "user", "content": "q"}])
    assert reply.content == "new port"
    assert supervisor.waits == 1


async def test_a_request_waits_for_a_server_that_comes_back_on_the_same_port(scripted, free_port):
    async def come_back_later(supervisor: FakeSupervisor) -> None:
        await asyncio.sleep(0.2)
        await scripted([(200, completion("same port"))], port=free_port)

    supervisor = FakeSupervisor(f"http://127.0.0.1:{free_port}/v1", on_wait=come_back_later)
    async with LLM(config(), supervisor, backoff_s=0) as llm:
        reply = await llm.chat([{"role": "user", "content": "q"}])
    assert reply.content == "same port"


async def test_the_error_is_surfaced_after_bounded_attempts(scripted):
    server = await scripted([(503, {"error": "still loading"})])
    supervisor = FakeSupervisor(server.url)
    async with LLM(config(), supervisor, attempts=3, backoff_s=0) as llm:
        with pytest.raises(LLMError) as caught:
            await llm.chat([{"role": "user", "content": "q"}])
    assert caught.value.attempts == 3
    assert caught.value.status_code == 503
    assert "failed 3 times" in str(caught.value)
    assert len(server.requests) == 3
    assert supervisor.waits == 2  # no pointless wait after the last attempt


async def test_a_4xx_is_not_retried(scripted):
    server = await scripted([(400, {"error": {"message": "context too long"}})])
    supervisor = FakeSupervisor(server.url)
    async with LLM(config(), supervisor, backoff_s=0) as llm:
        with pytest.raises(LLMError) as caught:
            await llm.chat([{"role": "user", "content": "q"}])
    assert caught.value.status_code == 400
    assert len(server.requests) == 1 and supervisor.waits == 0


async def test_a_server_that_never_becomes_ready_surfaces_as_llm_error(free_port):
    class NeverReady(FakeSupervisor):
        async def wait_ready(self, timeout: float | None = None) -> None:
            raise TimeoutError(f"not ready within {timeout} s")

    supervisor = NeverReady(f"http://127.0.0.1:{free_port}/v1")
    async with LLM(config(), supervisor, backoff_s=0) as llm:
        with pytest.raises(LLMError, match="did not become ready"):
            await llm.chat([{"role": "user", "content": "q"}])


def test_reply_is_a_plain_dataclass():
    reply = Reply(content="x")
    assert json.loads(json.dumps(reply.__dict__))["content"] == "x"


TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


async def test_function_calling_format_sends_tool_choice_auto_and_converts_tool_messages(scripted):
    server = await scripted([(200, completion("fine"))])
    messages = [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "5"},
    ]
    async with LLM(config(), base_url=server.url) as llm:
        await llm.chat(messages, tools=TOOLS)
    body = server.requests[0]
    assert body["tool_choice"] == "auto"
    assert body["messages"][1]["content"] == ""
    assert body["messages"][2] == {"role": "user", "content": "Result of add:\n5"}
    assert messages[2]["role"] == "tool"  # the caller's list is untouched


async def test_an_empty_auto_answer_is_asked_again_without_tools(scripted):
    server = await scripted([(200, completion("")), (200, completion("Hello there."))])
    async with LLM(config(), base_url=server.url) as llm:
        reply = await llm.chat([{"role": "user", "content": "hi"}], tools=TOOLS)
    assert reply.content == "Hello there."
    assert reply.choice == "message"  # the model chose words under the tool list
    assert [r["tool_choice"] for r in server.requests] == ["auto", "none"]
    assert reply.prompt_tokens == 22  # both requests are counted


async def test_other_chat_formats_are_sent_unchanged(scripted):
    server = await scripted([(200, completion(""))])
    cfg = Config.model_validate({"model": {"chat_format": "chatml"}})
    tool_message = {"role": "tool", "tool_call_id": "c1", "content": "5"}
    async with LLM(cfg, base_url=server.url) as llm:
        await llm.chat([tool_message], tools=TOOLS)
    assert "tool_choice" not in server.requests[0] and len(server.requests) == 1
    assert server.requests[0]["messages"] == [tool_message]


async def test_an_unreadable_answer_is_an_llm_error_quoting_it(free_port):
    from aiohttp import web

    async def garbage(request: web.Request) -> web.Response:
        return web.Response(text="<html>proxy error</html>", content_type="text/html")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", garbage)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", free_port).start()
    try:
        async with LLM(config(), base_url=f"http://127.0.0.1:{free_port}/v1") as llm:
            with pytest.raises(LLMError, match="no readable choice: <html>proxy error"):
                await llm.chat([{"role": "user", "content": "q"}])
    finally:
        await runner.cleanup()


async def test_a_bare_call_head_as_words_is_asked_again_as_that_call(scripted):
    # The handler's words under "auto" may be "functions.NAME:" and no arguments (seen
    # after a night): the tool it names is asked for, and its arguments are written then.
    call = {"id": "c9", "type": "function",
            "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    server = await scripted([(200, completion("functions.add:")),
                             (200, completion(None, [call]))])
    async with LLM(config(), base_url=server.url) as llm:
        reply = await llm.chat([{"role": "user", "content": "2 + 3?"}], tools=TOOLS)
    assert reply.tool_calls == [call] and reply.choice == "call_head"
    assert [r["tool_choice"] for r in server.requests] == [
        "auto", {"type": "function", "function": {"name": "add"}}]
    assert reply.prompt_tokens == 22
    # A head naming a tool that is not offered, or words around it, are left as they are
    # (the agent treats them as format errors or answers).
    for text in ("functions.nope:", "Use functions.add: to add."):
        server = await scripted([(200, completion(text))])
        async with LLM(config(), base_url=server.url) as llm:
            reply = await llm.chat([{"role": "user", "content": "2 + 3?"}], tools=TOOLS)
        assert reply.content == text and len(server.requests) == 1
    # A second ask that fails, or brings no call, leaves the head as the model's words (the
    # agent's guard reads it as the call it names); the tokens stay the first request's.
    for second in ((400, {"error": {"message": "bad grammar"}}), (200, completion(""))):
        server = await scripted([(200, completion("functions.add:")), second])
        async with LLM(config(), base_url=server.url) as llm:
            reply = await llm.chat([{"role": "user", "content": "2 + 3?"}], tools=TOOLS)
        assert reply.content == "functions.add:" and not reply.tool_calls, second
        assert reply.choice == "" and reply.prompt_tokens == 11 and len(server.requests) == 2
