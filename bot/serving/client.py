"""AsyncOpenAI client for the local model server.

One ``LLM.chat`` call returns a ``Reply`` with the text, the tool calls in
OpenAI's format (arguments left as the raw string the model wrote: parsing
them is the agent's job, and a malformed string is the model's error to see),
the usage and the duration.

The openai client's own retries are off: they would hammer a server that is
restarting. Instead a request that fails because the server is unreachable,
timed out or answered 5xx waits for the supervisor's ready event and is sent
again, a bounded number of times. While the supervisor says the server is not
ready (a restart, a restart-mode swap), a request queues before it is sent,
which costs no attempt; while it is ``paused`` (a single-GPU night), it
queues with no time limit, until the morning. The client follows ``supervisor.base_url``, so a
blue/green swap to another port needs no new LLM.

For the swap's drain, the LLM counts its requests in flight per base URL and
registers with the supervisor, which asks before it stops a server
(``bot.serving.swap``). The count goes up in the same synchronous step that reads the
URL, and down when the request ends, however it ends.

The request body is serialised here, once per request, with the tool list's
JSON cached per tool list: the registry hands out one list object per tool
set, and 40 schemas cost ~1 ms to serialise, more than the rest of a turn's
harness work (bench/agent.py). A tool list must not be changed in place
after it was sent; a new list is a new cache entry.
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

import openai
from openai.types.chat import ChatCompletion

from bot.config import Config
from bot.serving.wire import needs_tool_choice, server_messages

logger = logging.getLogger("nightshift.llm")

# What a restarting server produces; APITimeoutError is a subclass of APIConnectionError.
_RETRYABLE = (openai.APIConnectionError, openai.InternalServerError)


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
    # the tool list, which the night trains as the choice it is); "" otherwise.
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
        self._client: openai.AsyncOpenAI | None = None
        self._retired: list[openai.AsyncOpenAI] = []
        self._in_flight: Counter[str] = Counter()  # base URL without trailing "/" -> requests
        self._tools_json: dict[int, tuple[list, str]] = {}  # id(tools) -> (tools, its JSON)
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

    def _current_client(self) -> openai.AsyncOpenAI:
        url = self.base_url
        if self._client is None or str(self._client.base_url).rstrip("/") != url.rstrip("/"):
            if self._client is not None:
                # Requests may still be draining on the old server; _close_drained closes it.
                self._retired.append(self._client)
                logger.info("model server moved to %s", url)
            self._client = openai.AsyncOpenAI(
                base_url=url,
                api_key="local",  # the local server ignores it, but the client requires one
                max_retries=0,
                timeout=self.config.server.request_timeout_s,
                # Local traffic must not go through a proxy from the environment.
                http_client=openai.DefaultAsyncHttpxClient(trust_env=False),
            )
        return self._client

    async def _close_drained(self) -> None:
        """Close the clients of servers we moved away from, once nothing is in flight there."""
        drained = [c for c in self._retired if not self.in_flight(str(c.base_url))]
        self._retired = [c for c in self._retired if c not in drained]
        for client in drained:
            await client.close()

    @contextlib.contextmanager
    def _sending(self, client: openai.AsyncOpenAI) -> Iterator[None]:
        url = str(client.base_url).rstrip("/")
        self._in_flight[url] += 1
        try:
            yield
        finally:
            self._in_flight[url] -= 1
            if not self._in_flight[url]:
                del self._in_flight[url]

    async def close(self) -> None:
        clients = [*self._retired, *([self._client] if self._client else [])]
        self._client, self._retired = None, []
        for client in clients:
            await client.close()

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
        chat_format = self.config.model.chat_format
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
        if (tools and params.get("tool_choice") == "auto" and needs_tool_choice(chat_format)
                and not reply.tool_calls and not reply.content.strip()):
            # The model chose to answer in words, which this format returns empty (see
            # bot.serving.wire); ask again for the words, with the same conversation.
            answer = await self._complete({**params, "tool_choice": "none"})
            answer.duration_ms += reply.duration_ms
            answer.prompt_tokens += reply.prompt_tokens
            answer.completion_tokens += reply.completion_tokens
            answer.choice = "message"
            return answer
        return reply

    def _body(self, params: dict[str, Any]) -> bytes:
        """``params`` as JSON, the tool list's part from the cache."""
        tools = params.get("tools")
        if not tools:
            return json.dumps(params).encode()
        cached = self._tools_json.get(id(tools))
        if cached is None or cached[0] is not tools:  # the list is kept: its id stays unique
            if len(self._tools_json) >= 16:  # a few tool sets in practice; never unbounded
                self._tools_json.clear()
            cached = self._tools_json[id(tools)] = (tools, json.dumps(tools))
        rest = json.dumps({k: v for k, v in params.items() if k != "tools"})
        return f'{rest[:-1]}, "tools": {cached[1]}}}'.encode()

    async def _complete(self, params: dict[str, Any]) -> Reply:
        await self._close_drained()
        body = self._body(params)
        for attempt in range(1, self.attempts + 1):
            await self._until_ready(attempt - 1)
            # No await from here until the request is counted: a swap that moves the
            # supervisor after this point finds it in flight on the URL it was sent to.
            client = self._current_client()
            started = time.monotonic()
            try:
                with self._sending(client):
                    # client.post, not chat.completions.create: create() first walks the
                    # request through the SDK's typed transform, ~10 ms for 40 tool schemas
                    # (the harness's largest cost per turn, bench/agent.py); same JSON sent.
                    completion = await client.post("/chat/completions", content=body,
                                                   cast_to=ChatCompletion)
            except _RETRYABLE as exc:
                if attempt == self.attempts:
                    raise LLMError(
                        f"the model server at {client.base_url} failed {attempt} times; "
                        f"last error: {_describe(exc)}",
                        attempts=attempt,
                        status_code=getattr(exc, "status_code", None),
                    ) from exc
                logger.warning(
                    "chat attempt %d/%d failed (%s); waiting for the server",
                    attempt, self.attempts, _describe(exc),
                )  # fmt: skip
                await self._wait_for_server(attempt)
            except openai.APIStatusError as exc:
                # 4xx: the request itself is wrong (e.g. too long); sending it again cannot help.
                raise LLMError(
                    f"the model server refused the request: {_describe(exc)}",
                    attempts=attempt,
                    status_code=exc.status_code,
                ) from exc
            else:
                return _reply(completion, (time.monotonic() - started) * 1000, attempt)
        raise AssertionError("unreachable")

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


def _reply(completion: Any, duration_ms: float, attempt: int) -> Reply:
    if not completion.choices:
        raise LLMError("the model server answered with no choices", attempts=attempt)
    choice = completion.choices[0]
    message = choice.message
    tool_calls = [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.function.name, "arguments": call.function.arguments},
        }
        for call in message.tool_calls or []
    ]
    usage = completion.usage
    return Reply(
        content=message.content or "",
        tool_calls=tool_calls,
        finish_reason=choice.finish_reason,
        prompt_tokens=usage.prompt_tokens if usage else 0,
        completion_tokens=usage.completion_tokens if usage else 0,
        duration_ms=duration_ms,
        model=completion.model or "",
    )


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    detail = f"{status} " if status else ""
    return f"{type(exc).__name__}: {detail}{exc}"
