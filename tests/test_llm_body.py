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
