"""Prompt prefixes in the store: what the model was sent before an episode's own messages.

A training row must be the context the model saw, token for token: the system
prompt with the tool list, the channel history the turn was given, and any
compaction summary. Those messages are the same for every step of a turn (up
to a compaction), and would be the largest part of every step if copied. So
each distinct prefix is stored once, content-addressed by the SHA-256 of its
messages and tool-set ref, and each assistant step's meta says
``context = {"prefix": REF, "tail": N}``: it was sent the prefix's messages
and then the episode's N steps just before it (``tools: false`` when the ask
offered no tools). The prefix is written in the same transaction as the
episode's start (``Store.start_turn(..., prefix=)``), or, after a compaction,
as the first step that refers to it (``Store.add_step(..., prefix=)``), so no
acknowledged step points at a missing prefix.

``sources`` lists the episodes whose text a prefix carries (its history, and
the episode itself once a compaction summarised part of it): ``/forget`` of
any of them deletes the prefix (``core.storage.labels``), and the steps that
referred to it then train on their episode alone.

Mixed into ``Store`` (it uses the store's locked ``_fetch``).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

import orjson

from core.storage.forgetting import forgotten_sources_sql
from core.storage.schema import dumps, loads

# A prefix naming a forgotten episode among its sources is not stored: a turn that read
# the episode's text before the forget must not store it again (core.storage.forgetting).
INSERT_PREFIX = ("INSERT OR IGNORE INTO prompt_prefixes (ref, messages, tools_ref, sources, "
                 "created_at) SELECT ?1, ?2, ?3, ?4, ?5 WHERE NOT "
                 + forgotten_sources_sql("?4"))


@dataclass
class Prefix:
    """The messages before an episode's own part, and the tool set the turn offered."""

    messages: list[dict]
    tools_ref: str | None = None
    sources: tuple[int, ...] = ()  # episodes whose text it carries
    ref: str = field(init=False)

    _text: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Serialised once: the same text is hashed and stored. Every turn makes one, so
        # orjson (~5x json's speed); its text is json's for messages, which hold no floats.
        try:
            self._text = orjson.dumps(self.messages).decode()
        except TypeError:  # a lone surrogate or a non-string key: json's refusal and message
            self._text = dumps(self.messages, "prefix messages")
        self.ref = hashlib.sha256(f"{self.tools_ref}\n{self._text}".encode()).hexdigest()

    def values(self) -> tuple:
        return (self.ref, self._text, self.tools_ref, json.dumps(sorted(set(self.sources))),
                time.time())


class Prefixes:
    async def prompt_prefixes(self, refs: set[str] | list[str]) -> dict[str, dict]:
        """ref -> {"messages": [...], "tools": [...], "sources": [episode ids]} for the
        stored ones among ``refs`` (a deleted prefix is simply absent)."""
        refs = sorted(set(refs))
        out: dict[str, dict] = {}
        for i in range(0, len(refs), 500):  # SQLite's bound-parameter limit, with room
            chunk = refs[i:i + 500]
            rows = await self._fetch(
                "SELECT p.ref, p.messages, p.sources, t.schemas FROM prompt_prefixes p "
                "LEFT JOIN tool_sets t "
                f"ON t.ref = p.tools_ref WHERE p.ref IN ({','.join('?' * len(chunk))})",
                tuple(chunk))
            for r in rows:
                out[r["ref"]] = {"messages": loads(r["messages"]),
                                 "tools": loads(r["schemas"]) or [],
                                 "sources": loads(r["sources"]) or []}
        return out
