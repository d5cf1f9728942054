"""The night's client for the served model: schema-constrained JSON answers.

The trainer talks to the same local server as the bot, but only ever asks for
JSON under a schema (``response_format``), which llama.cpp enforces with a
grammar, so even a 135M model's reply parses. A reply that still fails
validation is the caller's to retry or skip; it is never repaired into
something the model did not say.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from core.config import Config
from core.model.served_at import served_url
from core.model.wire import neutral_messages


def json_format(schema: dict) -> dict:
    """A response_format that llama.cpp turns into a grammar. llama-cpp-python's server
    accepts only "text" and "json_object" (with "schema"), not OpenAI's "json_schema";
    llama.cpp's llama-server accepts this form too."""
    return {"type": "json_object", "schema": schema}


class ModelUnavailable(RuntimeError):
    """The served model could not be reached; the night stops, resumable."""


class JsonClient:
    def __init__(self, base_url: str, model: str, timeout_s: float = 300) -> None:
        self.model = model
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key="local", timeout=timeout_s, max_retries=2,
            http_client=openai.DefaultAsyncHttpxClient(trust_env=False))
        self.requests = 0

    @classmethod
    def for_config(cls, config: Config, base_url: str | None = None) -> JsonClient:
        """A client of the live server: where the bot's server answers now (a swap moves it
        to another port: ``core.model.served_at``), unless ``base_url`` is given."""
        return cls(base_url or served_url(config), config.model.alias,
                   config.server.request_timeout_s)

    async def ask(self, messages: list[dict], schema: dict, max_tokens: int,
                  name: str = "answer", temperature: float = 0.0) -> tuple[Any | None, str]:
        """(parsed JSON or None, raw text) for one schema-constrained completion."""
        self.requests += 1
        try:
            completion = await self._client.chat.completions.create(
                model=self.model, messages=neutral_messages(messages), max_tokens=max_tokens,
                temperature=temperature,
                response_format=json_format({"title": name, **schema}))
        except (openai.APIConnectionError, openai.InternalServerError) as exc:
            raise ModelUnavailable(f"the model server failed: {exc}") from exc
        raw = (completion.choices[0].message.content or "") if completion.choices else ""
        try:
            return json.loads(raw), raw
        except ValueError:
            return None, raw

    async def close(self) -> None:
        await self._client.close()
