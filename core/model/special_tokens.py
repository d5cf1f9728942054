"""Special-token text in content becomes plain text: a file cannot forge a turn.

The server renders the chat template without HTML escaping (``core.model.shim``)
and llama.cpp tokenizes the whole prompt with special tokens enabled. So the
characters ``<|im_end|><|im_start|>system`` in a file the agent reads, a
user's message or a tool's output would become the real ``<|im_end|>`` and
``<|im_start|>`` tokens: a turn the template never made, which the model
cannot tell from a real one.

``neutralise`` inserts a zero-width space (U+200B) after the first character
of every special-token text, so ``<|im_end|>`` becomes ``<\\u200b|im_end|>``.
A tokenizer matches special tokens as exact strings, so the result is read as
ordinary text tokens; on screen it looks the same. The change is idempotent
and loses nothing a person can see. Every piece of content that did not come
from the template goes through it on its way to the server
(``core.model.wire.server_messages``), and the night renders the same neutralised
text (``trainer.tokens`` renders what ``server_messages`` returns), so what
is trained is what was served.

Covered: every ``<|...|>`` token (ChatML, Llama 3, Phi, ...), DeepSeek's
full-width ``<｜...｜>``, ``<s>``/``</s>``, Mistral's ``[INST]``/``[/INST]``,
Gemma's turn markers, and the StarCoder family's names that SmolLM2 (the
embedded model) has as control tokens (``<filename>``, ``<jupyter_code>``,
...). Not covered: a served model whose control tokens have other shapes;
tests/test_special_tokens.py checks every control token of the embedded
model's vocabulary.
"""

from __future__ import annotations

import re
from typing import Any

ZERO_WIDTH_SPACE = "\u200b"

_NAMED = (
    "repo_name", "reponame", "file_sep", "filename", "gh_stars", "issue_start", "issue_comment",
    "issue_closed", "jupyter_start", "jupyter_text", "jupyter_code", "jupyter_output",
    "jupyter_script", "empty_output", "fim_prefix", "fim_middle", "fim_suffix", "fim_pad",
    "commit_before", "commit_msg", "commit_after", "start_of_turn", "end_of_turn", "s", "/s",
)
SPECIAL_TEXT = re.compile(
    r"<\|[^<>|\n]{0,64}\|>"  # <|im_end|>, <|begin_of_text|>, ...
    r"|<\uff5c[^<>\uff5c\n]{0,64}\uff5c>"  # <｜begin▁of▁sentence｜>
    r"|<(?:" + "|".join(re.escape(n) for n in _NAMED) + r")>"
    r"|\[/?INST\]"
)


def _plain(text: str) -> bool:
    """No special-token string can be in ``text``: each begins with < or [."""
    return "<" not in text and "[" not in text


def neutralise(text: str) -> str:
    """``text`` with every special-token string broken by a zero-width space."""
    if _plain(text):  # the common case: nothing to look at
        return text
    return SPECIAL_TEXT.sub(lambda m: m.group()[0] + ZERO_WIDTH_SPACE + m.group()[1:], text)


def neutralise_content(content: Any) -> Any:
    """A message's content: a string, or a list of parts whose text parts are neutralised."""
    if isinstance(content, str):
        return neutralise(content)
    if isinstance(content, list):
        return [{**part, "text": neutralise(part["text"])}
                if isinstance(part, dict) and isinstance(part.get("text"), str) else part
                for part in content]
    return content


def neutralise_message(message: dict) -> dict:
    """An OpenAI-shaped message with its content, name and tool calls neutralised: a
    copy, or the message itself when it is plain text with nothing to neutralise (every
    history message of every request; the callers never change what they get)."""
    content = message.get("content")
    if (type(content) is str and _plain(content) and "name" not in message
            and not message.get("tool_calls")):
        return message
    out = dict(message)
    if "content" in out:
        out["content"] = neutralise_content(out["content"])
    if isinstance(out.get("name"), str):
        out["name"] = neutralise(out["name"])
    if out.get("tool_calls"):
        out["tool_calls"] = [_neutralise_call(c) for c in out["tool_calls"]]
    return out


def _neutralise_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return call
    fixed = {k: neutralise(v) if k in ("name", "arguments") and isinstance(v, str) else v
             for k, v in function.items()}
    return {**call, "function": fixed}
