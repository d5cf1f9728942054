"""A tool call's arguments stop at the request's max_tokens, through the shimmed real
server and in-process (the gate): llama-cpp-python 0.3.36's function-calling handler
generated them with no limit, and the embedded model asked to write 300 numbers into a
file wrote its argument until the context was full (52 s, then an error, for a
2,048-token context on this CPU; 2 s bounded)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from core.model.shim import patch_handlers
from core.model.wire import FUNCTION_CALLING
from tests.shim_server import shim_server

WRITE_FILE = [{"type": "function", "function": {
    "name": "write_file", "description": "Write a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                    "content": {"type": "string"}},
                   "required": ["path", "content"]}}}]
ENDLESS = [{"role": "system", "content": "You write files."},
           {"role": "user", "content": "Write the numbers from 1 to 300, one per line, into a "
                                       "file named n.txt."}]
LIMIT = 16


def _cut_call(message: dict) -> str:
    """The one write_file call's arguments, which must have been cut (not valid JSON)."""
    calls = message.get("tool_calls") or []
    assert [c["function"]["name"] for c in calls] == ["write_file"], message
    arguments = calls[0]["function"]["arguments"]
    with pytest.raises(ValueError):
        json.loads(arguments)
    return arguments


@pytest.mark.slow
def test_the_gates_in_process_model_stops_an_endless_argument(served_gguf):
    from llama_cpp import Llama

    patch_handlers()
    patch_handlers()  # idempotent: wrapped once
    llm = Llama(model_path=str(served_gguf), n_ctx=2048, chat_format=FUNCTION_CALLING,
                verbose=False, seed=0)
    started = time.monotonic()
    reply = llm.create_chat_completion(messages=ENDLESS, tools=WRITE_FILE, tool_choice="auto",
                                       temperature=0, max_tokens=LIMIT)
    assert time.monotonic() - started < 30
    arguments = _cut_call(reply["choices"][0]["message"])
    assert len(llm.tokenize(arguments.encode(), add_bos=False)) <= LIMIT + 1
    assert reply["usage"]["completion_tokens"] <= LIMIT


@pytest.mark.slow
def test_the_shimmed_server_stops_an_endless_argument(served_gguf, free_port, tmp_path):
    with shim_server(served_gguf, free_port, tmp_path) as base:
        started = time.monotonic()
        reply = httpx.post(f"{base}/chat/completions", timeout=120, trust_env=False, json={
            "messages": ENDLESS, "tools": WRITE_FILE, "tool_choice": "auto",
            "temperature": 0, "max_tokens": LIMIT}).json()
    assert time.monotonic() - started < 30
    _cut_call(reply["choices"][0]["message"])
    assert reply["usage"]["completion_tokens"] <= LIMIT
