"""Two guards of the agent's loop against what a small model does wrong.

**Template syntax as text.** The chatml-function-calling template writes a
call as ``functions.NAME:`` followed by the JSON arguments. A model that
writes that form as plain text (e.g. when the server asked for words with
``tool_choice`` "none") has not answered; delivering ``functions.redo:`` to a
person is a harness bug. ``template_call`` turns such text into the call it
is when NAME is a registered tool and the arguments parse; anything else in
that form is a format error the agent re-asks about. It is never an answer.

**Repeated calls.** ``RepeatWatch`` counts each (tool, arguments, result)
triple of a turn. The same call with the same arguments that keeps giving
the same result cannot make progress (polling a file that does not change,
alternating read_file/list_dir on one path): at ``agent.repeat_limit`` the
observation says so and the agent asks for an answer without tools.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter

from core.model.wire import TEMPLATE_CALL
from serving.client import Reply

FORMAT_NOTE = ("Your last message was tool-call syntax ({shown}), not an answer and not a "
               "valid call. To use a tool, call it with its exact name and JSON arguments; "
               "the tools are: {names}. Otherwise answer the person in plain words.")
NO_TOOLS_NOTE = ("Your last message was tool-call syntax ({shown}), but no tools are offered "
                 "now. Answer the person in plain words.")
REPEAT_NOTE = ("\n\n[This is the {count} time you made this same call with the same "
               "arguments and got the same result. Calling it again will not help: "
               "answer now with what you know.]")


def looks_like_template_call(text: str) -> bool:
    """True when ``text`` is the template's call syntax rather than words."""
    return bool(TEMPLATE_CALL.match(text or ""))


def template_call(reply: Reply, tool_names: set[str]) -> Reply:
    """``reply`` with its text turned into a tool call where it is a well-formed one.

    A reply that already has tool calls, or whose text is not the template's call
    form, or names an unknown tool, or has arguments that are not a JSON object,
    comes back unchanged (the caller treats the last two as format errors).
    """
    if reply.tool_calls:
        return reply
    match = TEMPLATE_CALL.match(reply.content or "")
    if not match or match.group(1) not in tool_names:
        return reply
    raw = match.group(2).strip() or "{}"
    try:
        arguments = json.loads(raw)
    except ValueError:
        return reply
    if not isinstance(arguments, dict):
        return reply
    call_id = "call_text_" + hashlib.sha256(reply.content.encode()).hexdigest()[:8]
    call = {"id": call_id, "type": "function",
            "function": {"name": match.group(1), "arguments": json.dumps(arguments)}}
    return dataclasses.replace(reply, content="", tool_calls=[call],
                               finish_reason="tool_calls")


def format_note(text: str, tool_names: set[str]) -> str:
    shown = (text or "").strip()
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    if not tool_names:
        return NO_TOOLS_NOTE.format(shown=shown)
    return FORMAT_NOTE.format(shown=shown, names=", ".join(sorted(tool_names)))


def repeat_note(count: int) -> str:
    suffix = "th" if 10 <= count % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(count % 10, "th")
    return REPEAT_NOTE.format(count=f"{count}{suffix}")


class RepeatWatch:
    """Counts identical (tool, arguments, result) triples within one turn."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.counts: Counter[tuple[str, str, str]] = Counter()

    def see(self, name: str, arguments: str | dict, output: str) -> int:
        """Record one call; returns how many times this exact triple has now been seen."""
        key = (name, _canonical(arguments), hashlib.sha256(output.encode()).hexdigest())
        self.counts[key] += 1
        return self.counts[key]

    def tripped(self, count: int) -> bool:
        return count >= self.limit


def _canonical(arguments: str | dict) -> str:
    """Arguments as sorted JSON, so key order and spacing do not hide a repeat."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True)
