"""The HTTP client for the local model server's OpenAI-compatible chat API.

One ``LLM.chat`` call returns a ``Reply`` with the text, the tool calls in
OpenAI's format (arguments left as the raw string the model wrote: parsing
them is the agent's job, and a malformed string is the model's error to see),
the usage and the duration.

Retries are ours, not a library's: blind ones would hammer a server that is
restarting. A request that fails because the server is unreachable,
timed out or answered 5xx waits for the supervisor's ready event and is sent
again, a bounded number of times. While the supervisor says the server is not
ready (a restart, a restart-mode swap), a request queues before it is sent,
which costs no attempt; while it is ``paused`` (a single-GPU night), it
queues with no time limit, until the morning. The client follows ``supervisor.base_url``, so a
blue/green swap to another port needs no new LLM.

For the swap's drain, the LLM counts its requests in flight per base URL and
registers with the supervisor, which asks before it stops a server
(``serving.swap``). The count goes up in the same synchronous step that reads the
URL, and down when the request ends, however it ends.

The request body is serialised here, once per request, with the tool list's
JSON cached per tool list: the registry hands out one list object per tool
set, and 40 schemas cost ~1 ms to serialise, more than the rest of a turn's
harness work (bench/agent.py). A tool list must not be changed in place
after it was sent; a new list is a new cache entry.

The transport is ``serving.http`` (pooled keep-alive connections, the URL
given with each request) and the answer is read as JSON into a ``Reply``. The
openai SDK cost ~1 ms of Python per request (typed request building,
httpx/anyio layers, pydantic response models), and aiohttp after it ~25% of the
event loop's CPU per turn (bench/agent.py). The wire format is OpenAI's either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from core.config import Config
from core.model.chat_format import chat_format_name
from core.model.wire import call_head, needs_tool_choice, server_messages
from serving.http import HTTPClient, TransportError

logger = logging.getLogger("nightshift.llm")

_HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer local"}
MAX_REPLY_CHARS = 200_000  # a reply's text past this is cut: no context holds more
PARSE_ON_LOOP_BYTES = 256 * 1024  # a longer answer is parsed in a thread, not on the loop


class ServerError(Exception):
    """A 5xx answer: the server is failing or restarting, so the request is sent again."""

    def __init__(self, status: int, data: bytes) -> None:
        super().__init__(f"{status} {_error_text(data)}")
        self.status_code = status


# What a restarting server produces: refused or dropped connections, timeouts, 5xx.
_RETRYABLE = (TransportError, TimeoutError, ServerError)


class LLMError(RuntimeError):
    """A chat request failed for good; ``attempts`` says how often it was tried."""

    def __init__(self, message: str, *, attempts: int, status_code: int | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.status_code = status_code


class Supervised(Protocol):
    """What the LLM needs from a server supervisor.

    Optional, used where present: ``ready`` (False: queue before sending),
    ``paused`` (True: wait for ready with no time limit) and
    ``register_client(llm)`` (the swap's drain asks ``llm.in_flight(url)``)."""

    @property
    def base_url(self) -> str: ...

    async def wait_ready(self, timeout: float | None = None) -> None: ...


@dataclass
class Reply:
    content: str
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration_ms: float = 0.0
    model: str = ""
    # "message": offered tools, the model chose to answer in words (its "message:" under
    # the tool list, which the night trains as the choice it is); "call_head": its words
    # were a bare call head, asked again as that tool (the usage is both requests'); "".
    choice: str = ""


class LLM:
    """Chat with the served model, riding out server restarts."""

    def __init__(
        self,
        config: Config,
        supervisor: Supervised | None = None,
        *,
        base_url: str | None = None,
        attempts: int = 3,
        backoff_s: float = 0.5,
    ) -> None:
        self.config = config
        self.supervisor = supervisor
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self._fixed_url = base_url
        self._http: HTTPClient | None = None
        self._in_flight: Counter[str] = Counter()  # base URL without trailing "/" -> requests
        self._tools_json: dict[int, tuple[list, bytes]] = {}  # id(tools) -> (tools, its JSON)
        register = getattr(supervisor, "register_client", None)
        if register is not None:
            register(self)  # a swap drains our requests on the old server before stopping it

    def in_flight(self, url: str) -> int:
        """Requests sent to ``url`` and not yet ended (answered, failed or cancelled)."""
        return self._in_flight[url.rstrip("/")]

    @property
    def base_url(self) -> str:
        if self.supervisor is not None:
            return self.supervisor.base_url
        return self._fixed_url or self.config.base_url

    def _session(self) -> HTTPClient:
        # One pool for every server we talk to: the URL goes with each request, so a swap
        # to another port needs nothing new. No proxy from the environment: it is local.
        if self._http is None:
            self._http = HTTPClient(self.config.server.request_timeout_s)
        return self._http

    @contextlib.contextmanager
    def _sending(self, url: str) -> Iterator[None]:
        url = url.rstrip("/")
        self._in_flight[url] += 1
        try:
            yield
        finally:
            self._in_flight[url] -= 1
            if not self._in_flight[url]:
                del self._in_flight[url]

    async def close(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    async def __aenter__(self) -> LLM:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        response_format: dict | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        **kw: Any,
    ) -> Reply:
        """One chat completion; extra keywords go to the server unchanged."""
        chat_format = chat_format_name(self.config)
        params: dict[str, Any] = {"model": self.config.model.alias,
                                  "messages": server_messages(messages, chat_format), **kw}
        optional = {
            "tools": tools,
            "response_format": response_format,
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        params.update({k: v for k, v in optional.items() if v is not None})
        if tools and needs_tool_choice(chat_format):
            params.setdefault("tool_choice", "auto")
        reply = await self._complete(params)
        if not (tools and params.get("tool_choice") == "auto" and needs_tool_choice(chat_format)
                and not reply.tool_calls):
            return reply
        if not reply.content.strip():
            # The model chose to answer in words, which this format returns empty (see
            # core.model.wire); ask again for the words, with the same conversation.
            answer = _after(reply, await self._complete({**params, "tool_choice": "none"}))
            answer.choice = "message"
            return answer
        name = call_head(reply.content, tools)
        if name is not None:
            # Its words were a call's head with no arguments: the call it names, with the
            # arguments written under the tool's schema (the night trains it as that call).
            try:
                call = await self._complete(
                    {**params, "tool_choice": {"type": "function", "function": {"name": name}}})
            except LLMError as exc:
                # The head stands as the model's words (bot.agent.guards reads it as the call it
                # names), as the gate keeps it (trainer.gate_items).
                logger.warning("asking again for %s after a bare call head failed: %s", name, exc)
                return reply
            if call.tool_calls:
                call.choice = "call_head"
                return _after(reply, call)
            # The head stands: its time includes the second request, its tokens are the
            # first's (the prompt the stored step was answered from).
            reply.duration_ms += call.duration_ms
        return reply

    def _body(self, params: dict[str, Any]) -> bytes:
        """``params`` as JSON, the tool list's part from the cache."""
        tools = params.get("tools")
        if not tools:
            return _json(params)
        cached = self._tools_json.get(id(tools))
        if cached is None or cached[0] is not tools:  # the list is kept: its id stays unique
            if len(self._tools_json) >= 16:  # a few tool sets in practice; never unbounded
                self._tools_json.clear()
            cached = self._tools_json[id(tools)] = (tools, _json(tools))
        rest = _json({k: v for k, v in params.items() if k != "tools"})
        return b"".join((rest[:-1], b', "tools": ', cached[1], b"}"))

    async def _complete(self, params: dict[str, Any]) -> Reply:
        body = self._body(params)
        for attempt in range(1, self.attempts + 1):
            await self._until_ready(attempt - 1)
            # No await from here until the request is counted: a swap that moves the
            # supervisor after this point finds it in flight on the URL it was sent to.
            url = self.base_url
            started = time.monotonic()
            try:
                with self._sending(url):
                    status, data = await self._post(url, body)
                if status >= 500:
                    raise ServerError(status, data)
            except _RETRYABLE as exc:
                if attempt == self.attempts:
                    raise LLMError(
                        f"the model server at {url} failed {attempt} times; "
                        f"last error: {_describe(exc)}",
                        attempts=attempt,
                        status_code=getattr(exc, "status_code", None),
                    ) from exc
                logger.warning(
                    "chat attempt %d/%d failed (%s); waiting for the server",
                    attempt, self.attempts, _describe(exc),
                )  # fmt: skip
                await self._wait_for_server(attempt)
            else:
                if status >= 400:
                    # The request itself is wrong (e.g. too long); sending it again cannot help.
                    raise LLMError(
                        f"the model server refused the request: {status} {_error_text(data)}",
                        attempts=attempt, status_code=status)
                took = (time.monotonic() - started) * 1000
                if len(data) > PARSE_ON_LOOP_BYTES:  # a long answer is parsed off the loop
                    return await asyncio.to_thread(_reply, data, took, attempt)
                return _reply(data, took, attempt)
        raise AssertionError("unreachable")

    async def _post(self, url: str, body: bytes) -> tuple[int, bytes]:
        """POST the chat request; the status and the raw answer (parsed by the caller)."""
        return await self._session().post(f"{url.rstrip('/')}/chat/completions", body,
                                          _HEADERS)

    async def _until_ready(self, attempts: int) -> None:
        """Queue while the supervisor says the server is away; ``attempts`` made so far."""
        # A loop: the ready event can be cleared again between its set and our wake-up.
        while self.supervisor is not None and not getattr(self.supervisor, "ready", True):
            await self._wait_ready(attempts)

    async def _wait_for_server(self, attempt: int) -> None:
        # Back off first: a failure can reach us before the watchdog has noticed and cleared
        # the ready event, and wait_ready would then return at once.
        await asyncio.sleep(self.backoff_s * attempt)
        if self.supervisor is not None:
            await self._wait_ready(attempt)

    async def _wait_ready(self, attempts: int) -> None:
        # The longest the supervisor keeps the server away: a restart-mode swap drains
        # (request timeout), stops (grace), starts, and may start the old model again;
        # a watchdog restart may wait out its cooldown first.
        server = self.config.server
        timeout = (server.request_timeout_s + server.stop_grace_s + 2 * server.start_timeout_s
                   + self.config.watchdog.restart_cooldown_s)
        while True:
            try:
                await self.supervisor.wait_ready(timeout)
                return
            except TimeoutError as exc:
                if getattr(self.supervisor, "paused", False):
                    continue  # stopped on purpose for the night: wait for the morning
                raise LLMError(
                    f"the model server at {self.base_url} did not become ready again: {exc}",
                    attempts=attempts,
                ) from exc


def _after(first: Reply, second: Reply) -> Reply:
    """``second``, asked because of ``first``, with both requests' time and tokens."""
    second.duration_ms += first.duration_ms
    second.prompt_tokens += first.prompt_tokens
    second.completion_tokens += first.completion_tokens
    return second


def _reply(data: bytes, duration_ms: float, attempt: int) -> Reply:
    """The server's answer as a Reply; LLMError, saying what is wrong, for one that does not
    have the shape of a chat completion (a server that lies must not raise KeyError or
    TypeError into a turn). Content past ``MAX_REPLY_CHARS`` is cut (and logged)."""
    try:
        completion = json.loads(data)
        choice = completion["choices"][0]
        message = choice["message"]
        if not isinstance(message, dict):
            raise TypeError("the message is not an object")
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise LLMError(f"the model server answered with no readable choice: "
                       f"{_error_text(data)}", attempts=attempt) from exc
    try:
        tool_calls = [_tool_call(call) for call in message.get("tool_calls") or []]
    except (KeyError, TypeError, ValueError) as exc:
        raise LLMError(f"the model server answered with a malformed tool call ({exc}): "
                       f"{_error_text(data)}", attempts=attempt) from exc
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise LLMError(f"the model server answered with content that is not text: "
                       f"{_error_text(data)}", attempts=attempt)
    if len(content) > MAX_REPLY_CHARS:  # cut bare: a note here would be trained as its words
        logger.warning("the model server's reply had %d characters; kept the first %d",
                       len(content), MAX_REPLY_CHARS)
        content = content[:MAX_REPLY_CHARS]
    usage = completion.get("usage") if isinstance(completion.get("usage"), dict) else {}
    return Reply(
        content=content,
        tool_calls=tool_calls,
        finish_reason=str(choice.get("finish_reason") or "") or None,
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        duration_ms=duration_ms,
        model=str(completion.get("model") or ""),
    )


def _tool_call(call: Any) -> dict:
    """One tool call in OpenAI's shape, checked: a name that is text, arguments that are
    text (an object is written as JSON)."""
    function = call["function"]
    name, arguments = function["name"], function.get("arguments", "")
    if not isinstance(name, str) or not name:
        raise ValueError("a call without a name")
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments)
    if not isinstance(arguments, str):
        raise ValueError(f"arguments of {name} are {type(arguments).__name__}, not text")
    call_id = call.get("id")
    return {"id": call_id if isinstance(call_id, str) else None, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _error_text(data: bytes) -> str:
    return data[:300].decode("utf-8", "replace")


def _json(value: Any) -> bytes:
    """``value`` as JSON: orjson is ~5x faster than json on a turn's messages; json
    only where orjson refuses (a lone surrogate in text, a non-string key)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value).encode()


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    detail = f"{status} " if status else ""
    return f"{type(exc).__name__}: {detail}{exc}"
