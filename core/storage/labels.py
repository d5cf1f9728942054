"""Labels that people can take back, and episodes they can have forgotten.

Mixed into ``Store`` (it uses the store's locked ``_fetch`` and ``_write``).

- A reaction's label is stored with its giver's user id; removing the
  reaction deletes that giver's label row, so the episode's labels are always
  the ones standing, in the order given, and the latest one counts
  (``Episode.label``).
- ``forget_episode`` is ``/forget`` (or a 🗑 reaction): the episode is marked
  forgotten, which excludes it from training and from later channel history,
  and its text is erased in place: each step's content, tool calls, speaker
  name and meta (which holds the tool list and any image hashes), and the
  payloads of its events except the reply-message ids that link Discord
  messages to it, and the prompt prefixes that carry its text (later turns'
  history or summaries; those turns then train on their own messages alone).
  The rows themselves stay, so the ids that a past night's advantages refer to
  still exist. Not erased: what a past night already
  derived from it (judged sub-task descriptions in that night's ledger, the
  value memory, that night's JSONL dataset on disk).
"""

from __future__ import annotations

import time

from core.storage.schema import LABELS, check

# Events that hold no text of the conversation: kept, so that a reaction on one of the
# episode's replies still finds it (and finds it forgotten).
KEPT_EVENTS = ("discord_reply",)


class LabelBook:
    async def remove_label(self, episode_id: int, label: str, source: str, user_id: int) -> int:
        """Take back ``user_id``'s ``label`` of an episode (all such rows); how many went."""
        check(label, LABELS, "label")
        rows = await self._fetch(
            "DELETE FROM labels WHERE episode_id = ? AND label = ? AND source = ? "
            "AND user_id = ? RETURNING id", (episode_id, label, source, user_id))
        return len(rows)

    async def forget_episode(self, episode_id: int) -> int:
        """Exclude an episode from training and erase its text; returns the steps erased.

        An open episode is refused: its turn is still writing steps."""
        marks = ", ".join("?" * len(KEPT_EVENTS))
        async with self._write() as db:
            found = await db.execute_fetchall(
                "SELECT status FROM episodes WHERE id = ?", (episode_id,))
            if not found:
                raise ValueError(f"no episode {episode_id}")
            if found[0]["status"] == "open":
                raise ValueError(f"episode {episode_id} is still running; forget it when "
                                 "its turn has ended")
            await db.execute("UPDATE episodes SET forgotten_at = COALESCE(forgotten_at, ?) "
                             "WHERE id = ?", (time.time(), episode_id))
            cur = await db.execute(
                "UPDATE steps SET content = '', tool_calls = NULL, name = NULL, meta = NULL "
                "WHERE episode_id = ?", (episode_id,))
            await db.execute(
                f"UPDATE events SET payload = '{{}}' WHERE episode_id = ? "
                f"AND kind NOT IN ({marks})", (episode_id, *KEPT_EVENTS))
            # Prompt prefixes that carry its text (history, summaries): core.storage.prefixes.
            await db.execute(
                "DELETE FROM prompt_prefixes WHERE EXISTS (SELECT 1 FROM "
                "json_each(prompt_prefixes.sources) WHERE json_each.value = ?)", (episode_id,))
            erased = cur.rowcount
        self._received.clear()  # the bot's copies of steps, the erased text among them
        return erased

    async def is_forgotten(self, episode_id: int) -> bool:
        rows = await self._fetch("SELECT forgotten_at FROM episodes WHERE id = ?", (episode_id,))
        return bool(rows) and rows[0]["forgotten_at"] is not None
