"""A scripted model for agent tests: replays canned replies, records what it was sent."""

from __future__ import annotations

import copy
import json
from typing import Callable

from serving.client import Reply


def say(text: str) -> Reply:
    return Reply(content=text, tool_calls=[], finish_reason="stop", model="scripted")


def call(name: str, arguments: dict | str, call_id: str = "call_1") -> Reply:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Reply(content="", finish_reason="tool_calls", model="scripted",
                 tool_calls=[{"id": call_id, "type": "function",
                              "function": {"name": name, "arguments": args}}])


class ScriptedLLM:
    """``script`` is a list of Replies, or a function of (messages, kwargs) -> Reply."""

    def __init__(self, script: list[Reply] | Callable[[list[dict], dict], Reply]) -> None:
        self.script = script
        self.calls: list[tuple[list[dict], dict]] = []

    async def chat(self, messages: list[dict], **kwargs) -> Reply:
        self.calls.append((copy.deepcopy(messages), kwargs))
        if callable(self.script):
            return self.script(messages, kwargs)
        if not self.script:
            raise AssertionError("the scripted model ran out of replies")
        return self.script.pop(0)

    async def close(self) -> None:
        pass
