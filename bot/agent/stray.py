"""The stray end of turn: an answer that reads as unfinished ("I will now check
the file.") is questioned once per turn, and on "no" the turn goes on.

``bot.channels.RuleStrayDetector`` flags the answer; the question, the model's
JSON answer and the go-ahead are stored as probe steps (harness text: the night
trains none of them, ``trainer.tokens``), and the agent stores the event.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from bot.agent.messages import yes_no
from serving.client import LLM, LLMError

STRAY_QUESTION = ("Did you mean to end your turn? Answer yes if your last message is your "
                  "final answer, or no if you still have work to do.")
STRAY_CONTINUE = "Then continue: do the remaining work now, using the tools."
# json_object + schema: the form llama-cpp-python's server turns into a grammar.
STRAY_SCHEMA = {"type": "json_object", "schema": {
    "type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"]}}


async def ask_meant_to_continue(llm: LLM, messages: list[dict],
                                probe: Callable[[str, str], Awaitable[None]]) -> str | None:
    """"yes" (the answer stands) or "no" (the turn goes on) to the question, asked at the
    end of ``messages``; None when the server failed (the answer stands). ``probe(role,
    text)`` stores a probe step and appends it to ``messages``; the agent adds the
    go-ahead, ``STRAY_CONTINUE``, after it has stored the event."""
    await probe("user", STRAY_QUESTION)
    try:
        reply = await llm.chat(messages, response_format=STRAY_SCHEMA, max_tokens=16,
                               temperature=0)
    except LLMError:
        return None
    await probe("assistant", reply.content)
    return yes_no(reply.content)
