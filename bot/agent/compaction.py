"""Compaction: when a channel's context outgrows the model's window, its older
messages become one summary written by the model.

The system section and the most recent messages stay as they were
(``agent.keep_recent_messages``, cut where a turn begins: ``recent_start``), and
the summary goes after the system prompt as a user message starting with
``SUMMARY_PREFIX``. The agent stores the event and tells the episode's context
(``EpisodeContext.compacted``) so the night renders the summary the model saw.
"""

from __future__ import annotations

import json

from bot.agent.messages import estimate_tokens, recent_start, strip_reasoning, text_of
from core.config import Config
from serving.client import LLM

SUMMARY_PREFIX = "Summary of the earlier conversation: "
# Of each old message: a pasted file must not fill the summariser's window.
_SUMMARY_INPUT_CHARS = 2000


class SchemaSize:
    """The tool list's share of the prompt (the server renders each tool's name and
    parameter schema), estimated once per list object: the registry hands out one per
    tool set."""

    def __init__(self) -> None:
        self._sized: tuple[object, int] = (None, 0)

    def tokens(self, schemas: list[dict]) -> int:
        if self._sized[0] is not schemas:
            rendered = [(t["function"]["name"], t["function"].get("parameters")) for t in schemas]
            self._sized = (schemas, estimate_tokens([{"content": json.dumps(rendered)}]))
        return self._sized[1]


def to_compact(config: Config, messages: list[dict], schema_tokens: int) -> int:
    """How many messages after the system prompt to summarise (0: the context fits, or
    there is nothing old enough)."""
    budget = config.model.context_tokens - config.agent.max_reply_tokens - 256
    if estimate_tokens(messages) + schema_tokens <= budget:
        return 0
    return recent_start(messages[1:], config.agent.keep_recent_messages)


def compacted(messages: list[dict], old: int, summary: str) -> list[dict]:
    """``messages`` with ``messages[1:old + 1]`` replaced by the summary."""
    return [messages[0], {"role": "user", "content": SUMMARY_PREFIX + summary},
            *messages[old + 1:]]


async def summarise(llm: LLM, old: list[dict]) -> str:
    """The model's summary of ``old`` (raises the client's LLMError)."""
    transcript = "\n".join(f"{m['role']}: {text_of(m.get('content'))[:_SUMMARY_INPUT_CHARS]}"
                           for m in old)
    prompt = [{"role": "system", "content": "You summarise conversations faithfully."},
              {"role": "user", "content": "Summarise this conversation in a few sentences, "
               "keeping facts, file names, decisions and open tasks:\n\n" + transcript}]
    reply = await llm.chat(prompt, max_tokens=256, temperature=0)
    return strip_reasoning(reply.content).strip() or "(no summary)"
