"""Labels that people can take back.

Mixed into ``Store`` (it uses the store's locked ``_fetch``).

A reaction's label is stored with its giver's user id; removing the reaction
deletes that giver's label row, so the episode's labels are always the ones
standing, in the order given, and the latest one counts (``Episode.label``).
``/forget`` (or a 🗑 reaction) is ``core.storage.forgetting``.
"""

from __future__ import annotations

from core.storage.schema import LABELS, check


class LabelBook:
    async def remove_label(self, episode_id: int, label: str, source: str, user_id: int) -> int:
        """Take back ``user_id``'s ``label`` of an episode (all such rows); how many went."""
        check(label, LABELS, "label")
        rows = await self._fetch(
            "DELETE FROM labels WHERE episode_id = ? AND label = ? AND source = ? "
            "AND user_id = ? RETURNING id", (episode_id, label, source, user_id))
        return len(rows)
