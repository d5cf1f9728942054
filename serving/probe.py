"""Is a model server ready? ``GET /models``, then a one-token chat completion.

llama.cpp can answer its health routes while generation is wedged, so only a
real completion (the canary) counts. Each probe returns ``(ok, what went
wrong)`` and never raises: the supervisor and its watchdog decide what a
failure means.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx

from core.config import Config

_MODELS_TIMEOUT_S = 2.0
_LOG_TAIL_LINES = 25


async def probe(config: Config, base_url: str) -> tuple[bool, str]:
    """``GET /models``, then the canary."""
    try:
        async with httpx.AsyncClient(timeout=_MODELS_TIMEOUT_S, trust_env=False) as http:
            response = await http.get(f"{base_url}/models")
    except httpx.HTTPError as exc:
        return False, f"GET /models: {type(exc).__name__}"
    if response.status_code != 200:
        return False, f"GET /models answered {response.status_code}"
    return await canary(config, base_url)


async def canary(config: Config, base_url: str) -> tuple[bool, str]:
    """A one-token chat completion under ``watchdog.canary_timeout_s``."""
    timeout = config.watchdog.canary_timeout_s
    body = {
        "model": config.model.alias,
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 1,
        "temperature": 0,
    }
    try:
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as http:
            response = await asyncio.wait_for(
                http.post(f"{base_url}/chat/completions", json=body), timeout
            )
    except (httpx.TimeoutException, TimeoutError):
        return False, f"canary timed out after {timeout} s"
    except httpx.HTTPError as exc:
        return False, f"canary: {type(exc).__name__}: {exc}"
    if response.status_code != 200:
        return False, f"canary answered {response.status_code}: {response.text[:200]}"
    try:
        response.json()["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return False, f"canary answered without choices: {response.text[:200]}"
    return True, "ok"


async def log_tail(log_path: Path) -> str:
    """The server log's last lines, to explain a failed start."""

    def read() -> str:
        try:
            with open(log_path, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - 8192))
                text = log.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"(cannot read it: {exc})"
        return "\n".join(text.splitlines()[-_LOG_TAIL_LINES:])

    return f"Server log {log_path}, last lines:\n{await asyncio.to_thread(read)}"
