"""Tool sets in the store: each distinct tool list stored once, steps refer to it.

The night renders each turn with the tool schemas the model saw, so the
system step of every turn must name them. Stored inline, that was ~18 KB of
JSON per turn with every tool (serialised, written, read back), the same
bytes each time. Instead ``tool_set_ref`` stores a list once under its
SHA-256 and the system step's meta carries ``tools_ref``; ``episodes_since``
puts the list back as ``meta["tools"]``, so readers see what they saw before.

Mixed into ``Store`` (it uses the store's locked ``_fetch``). The reference is
cached per list object: the registry hands out one list per tool set, and a
list must not be changed in place after it was stored.
"""

from __future__ import annotations

import hashlib
import json
import time

from core.storage.schema import Episode, loads


class ToolSets:
    _tool_refs: dict[int, tuple[list, str]]

    async def tool_set_ref(self, schemas: list[dict]) -> str:
        """The reference of ``schemas``, stored (once) before it is returned."""
        refs = self.__dict__.setdefault("_tool_refs", {})
        cached = refs.get(id(schemas))
        if cached is not None and cached[0] is schemas:
            return cached[1]
        text = json.dumps(schemas, sort_keys=True)
        ref = hashlib.sha256(text.encode()).hexdigest()
        await self._fetch("INSERT OR IGNORE INTO tool_sets (ref, schemas, created_at) "
                          "VALUES (?, ?, ?)", (ref, text, time.time()))
        if len(refs) >= 16:  # a few tool sets in practice; never unbounded
            refs.clear()
        refs[id(schemas)] = (schemas, ref)  # the list is kept, so its id stays unique
        return ref

    async def _expand_tool_sets(self, episodes: list[Episode]) -> None:
        """Put each referenced tool list back into its step's meta as ``tools``."""
        wanted = {s.meta["tools_ref"] for e in episodes for s in e.steps
                  if isinstance(s.meta, dict) and "tools_ref" in s.meta}
        if not wanted:
            return
        marks = ",".join("?" * len(wanted))
        rows = await self._fetch(f"SELECT ref, schemas FROM tool_sets WHERE ref IN ({marks})",
                                 tuple(wanted))
        found = {r["ref"]: loads(r["schemas"]) for r in rows}
        for episode in episodes:
            for step in episode.steps:
                if isinstance(step.meta, dict) and "tools_ref" in step.meta:
                    step.meta["tools"] = found.get(step.meta["tools_ref"], [])
