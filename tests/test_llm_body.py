"""The request body: serialised once per request, the tool list's JSON cached per list."""

from __future__ import annotations

import json

from core.config import Config
from serving.client import LLM
from tools import default_registry


def test_the_body_is_the_params_as_json_with_the_tool_list_cached_per_list():
    llm = LLM(Config(), base_url="http://127.0.0.1:1/v1")
    tools = default_registry().schemas()
    params = {"model": "m", "messages": [{"role": "user", "content": 'say "hi"\n'}],
              "tools": tools, "tool_choice": "auto", "temperature": 0.3}
    assert json.loads(llm._body(params)) == params
    cached = llm._tools_json[id(tools)][1]
    params["messages"].append({"role": "assistant", "content": "hi"})
    assert json.loads(llm._body(params)) == params
    assert llm._tools_json[id(tools)][1] is cached  # serialised once for this list
    other = tools[:3]
    assert json.loads(llm._body({**params, "tools": other}))["tools"] == other
    assert len(llm._tools_json) == 2
    assert json.loads(llm._body({"model": "m", "messages": []})) == {"model": "m", "messages": []}


def _answer(message) -> bytes:
    return json.dumps({"choices": [{"message": message, "finish_reason": "stop"}],
                       "model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
                      ).encode()


def test_a_lying_servers_answers_are_llm_errors_not_key_or_type_errors():
    """Malformed tool calls raised KeyError or TypeError out of the client (issue 40)."""
    import pytest

    from serving.client import LLMError, _reply

    for message, why in (
            ({"tool_calls": [{"function": {}}]}, "malformed tool call"),
            ({"tool_calls": ["x"]}, "malformed tool call"),
            ({"tool_calls": [{"function": {"name": 3}}]}, "malformed tool call"),
            ({"tool_calls": [{"function": {"name": "f", "arguments": [1]}}]}, "not text"),
            ({"content": {"a": 1}}, "content that is not text"),
            ("a string", "no readable choice")):
        with pytest.raises(LLMError, match=why):
            _reply(_answer(message), 1.0, 1)
    ok = _reply(_answer({"tool_calls": [{"id": 7, "function": {"name": "f",
                                                                "arguments": {"a": 1}}}]}), 1, 1)
    assert ok.tool_calls == [{"id": None, "type": "function",
                              "function": {"name": "f", "arguments": '{"a": 1}'}}]


def test_a_reply_past_the_cap_is_cut_bare_so_no_harness_note_is_trained_as_its_words():
    from serving.client import MAX_REPLY_CHARS, _reply

    reply = _reply(_answer({"content": "x" * (MAX_REPLY_CHARS + 10)}), 1.0, 1)
    assert reply.content == "x" * MAX_REPLY_CHARS and reply.prompt_tokens == 3
