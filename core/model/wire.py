"""Messages as the local server needs them, for the chat formats that need help.

llama-cpp-python's ``chatml-function-calling`` format (checked with 0.3.36):
- renders no tools at all unless ``tool_choice`` is given, so ``auto`` is sent;
- has no template branch for ``tool`` messages (their content is dropped), so
  tool observations are sent as user messages naming the tool;
- refuses an assistant message whose content is null;
- under ``auto``, constrains a plain answer with the tool-name grammar, so the
  answer comes back empty: the LLM client then asks again with ``tool_choice``
  ``none``, which renders the same conversation without the tool list;
- that grammar lets the answer be a call's head, ``functions.NAME:``, with no
  arguments (the model chose words, then named a tool): the client then asks
  for that tool by name, and the handler writes its arguments under the tool's
  JSON schema (``call_head``).

For every format, special-token text in the content (``<|im_end|>`` in a
file the agent read) is neutralised first (``core.model.special_tokens``): the server
tokenizes the prompt with special tokens on, and content must not forge turns.

The store keeps the conversation in OpenAI's shape; this module only changes
what goes over the wire, in one place, so the night can render it the same way.
"""

from __future__ import annotations

import re

from core.model.special_tokens import neutralise_message

FUNCTION_CALLING = "chatml-function-calling"
TOOL_RESULT_PREFIX = "Result of {name}:\n"


def server_messages(messages: list[dict], chat_format: str) -> list[dict]:
    """The request's messages for ``chat_format`` (a new list; inputs untouched)."""
    messages = neutral_messages(messages)
    if chat_format != FUNCTION_CALLING:
        return messages
    out = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            out.append({"role": "user", "content": "".join(tool_result_parts(message))})
        elif role == "assistant":
            fixed = {"role": "assistant", "content": message.get("content") or ""}
            if message.get("tool_calls"):
                fixed["tool_calls"] = message["tool_calls"]
            out.append(fixed)
        else:
            out.append(message)
    return out


def neutral_messages(messages: list[dict]) -> list[dict]:
    """The messages with special-token text neutralised and nothing else changed, for
    requests without tools in any format (the night's JSON questions, the gate's
    prompts): copies where something changed, else the caller's own dicts, so what is
    returned must not be changed."""
    return [neutralise_message(m) for m in messages]


def tool_result_parts(message: dict) -> tuple[str, str]:
    """A tool message sent as a user message, in two parts: the ``Result of NAME:`` prefix
    and the output, both neutralised; the server reads their concatenation."""
    message = neutralise_message(message)  # idempotent: harmless on an already sent copy
    return (TOOL_RESULT_PREFIX.format(name=message.get("name") or "the tool"),
            message.get("content") or "")


# The template's call syntax as text: ``functions.NAME:`` and what follows (the arguments,
# if any). bot.agent.guards reads a whole reply in it; ``call_head`` a bare head. A leading
# ``<tool_call>``-like wrapper is not this template's, so it is not recognised.
TEMPLATE_CALL = re.compile(r"^\s*functions\.([A-Za-z_][\w.-]*)\s*:?\s*(.*?)\s*$", re.DOTALL)


def call_head(text: str, tools: list[dict]) -> str | None:
    """The offered tool that ``text`` names as a bare call head (``functions.NAME:``, no
    arguments), or None."""
    match = TEMPLATE_CALL.match(text or "")
    if not match or match.group(2):
        return None
    names = {t.get("function", {}).get("name") for t in tools}
    return match.group(1) if match.group(1) in names else None


def needs_tool_choice(chat_format: str) -> bool:
    return chat_format == FUNCTION_CALLING
