"""``/forget`` in the store: an episode excluded from training and its text erased, open
or not, and no write after it that stores the text again.

Mixed into ``Store`` (it uses the store's locked ``_write`` and ``_fetch``).

``forget_episode`` is one transaction. It marks the episode forgotten and, if it is still
open (its turn is running, or was cut off by a crash or a tool that never returned),
closes it (``aborted``). It erases in place each step's content, tool calls, speaker name
and meta, and the payloads of its events except the reply-message ids that link Discord
messages to it. It deletes the prompt prefixes that carry its text (later turns' history,
summaries), empties the compaction summaries of later episodes that read it (their
payload names it in ``sources``, or, for older events, their steps refer to a deleted
prefix), and deletes the night ledger's records derived from it (judged windows and value
predictions that name it in ``episodes``; older records without that list are deleted
for the whole channel, as they cannot say). The rows themselves stay, so ids a past
night's advantages refer to still exist. It returns the episode as it was, so the caller
can erase the copies outside the store (``bot.forgetting``).

Atomic against a running turn: SQLite serialises the forget with the writer process's
group commits, so each of the turn's writes lands either before it (and is erased) or
after it, where the writer refuses it (``core.storage.operations``): a step for a
forgotten episode raises ``EpisodeForgotten``, its end is a no-op, its events are stored
blank, and no prompt prefix or ledger record naming it is stored.

The file: the store's connection runs with ``secure_delete`` (freed bytes are zeroed),
and after the forget the write-ahead log is checkpointed and truncated, so the old text
is not left in the file's free pages or old log frames. When another process holds a
read open (a night), the truncation can wait; ``Forgotten.checkpointed`` says whether it
completed, and the next checkpoint finishes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from core.storage.schema import Episode, stored_step

# Events that hold no text of the conversation: kept, so that a reaction on one of the
# episode's replies still finds it (and finds it forgotten).
KEPT_EVENTS = ("discord_reply",)
COMPACTION = "compaction"  # core.storage.events.Event.COMPACTION
_CHECKPOINT_WAIT_MS = 2000  # how long the log's truncation waits for readers


class EpisodeForgotten(ValueError):
    """A write for an episode that was forgotten: it is refused, never stored."""

    def __init__(self, episode_id: int) -> None:
        super().__init__(f"episode {episode_id} was forgotten; nothing more is stored for it")
        self.episode_id = episode_id

    def __reduce__(self):  # crosses from the writer process pickled
        return (EpisodeForgotten, (self.episode_id,))


@dataclass
class Forgotten:
    """What a forget found and did, for the caller to erase what lies outside the store."""

    episode: Episode  # as it was before the erasure: its steps hold the text
    was_open: bool  # it was still open: its turn was running, or never ended
    steps: int  # steps erased
    summaries: int  # later episodes' compaction summaries emptied
    records: int  # night ledger records deleted
    checkpointed: bool  # the write-ahead log was truncated: no old copy in the file


class ForgetBook:
    async def forget_episode(self, episode_id: int) -> Forgotten:
        """Exclude an episode from training and erase its text (open or not)."""
        now = time.time()
        async with self._write() as db:
            rows = await db.execute_fetchall("SELECT * FROM episodes WHERE id = ?", (episode_id,))
            if not rows:
                raise ValueError(f"no episode {episode_id}")
            episode = Episode(**dict(rows[0]))
            episode.steps = [stored_step(r) for r in await db.execute_fetchall(
                "SELECT * FROM steps WHERE episode_id = ? ORDER BY seq", (episode_id,))]
            await db.execute(
                "UPDATE episodes SET forgotten_at = COALESCE(forgotten_at, ?), "
                "ended_at = COALESCE(ended_at, ?), "
                "status = CASE status WHEN 'open' THEN 'aborted' ELSE status END WHERE id = ?",
                (now, now, episode_id))
            cur = await db.execute(
                "UPDATE steps SET content = '', tool_calls = NULL, name = NULL, meta = NULL "
                "WHERE episode_id = ?", (episode_id,))
            erased = cur.rowcount
            marks = ", ".join("?" * len(KEPT_EVENTS))
            await db.execute(f"UPDATE events SET payload = '{{}}' WHERE episode_id = ? "
                             f"AND kind NOT IN ({marks})", (episode_id, *KEPT_EVENTS))
            summaries = await _empty_summaries(db, episode)
            # Prompt prefixes that carry its text (history, summaries): core.storage.prefixes.
            await db.execute(
                "DELETE FROM prompt_prefixes WHERE EXISTS (SELECT 1 FROM "
                "json_each(prompt_prefixes.sources) WHERE json_each.value = ?)", (episode_id,))
            records = await _delete_records(db, episode)
        self._received.clear()  # the bot's copies of steps, the erased text among them
        return Forgotten(episode, episode.status == "open", erased, summaries, records,
                         await self._truncate_log())

    async def _truncate_log(self) -> bool:
        """Checkpoint the write-ahead log and truncate it (its old frames hold the text)."""
        async with self._lock:
            await self._db.execute(f"PRAGMA busy_timeout = {_CHECKPOINT_WAIT_MS}")
            try:
                busy, _, _ = await (await self._db.execute(
                    "PRAGMA wal_checkpoint(TRUNCATE)")).fetchone()
            finally:
                await self._db.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
        return not busy

    async def is_forgotten(self, episode_id: int) -> bool:
        rows = await self._fetch("SELECT forgotten_at FROM episodes WHERE id = ?", (episode_id,))
        return bool(rows) and rows[0]["forgotten_at"] is not None

    async def forgotten_episodes(self, since: float = 0.0) -> dict[int, str]:
        """Episode id -> channel of every episode forgotten at or after ``since``."""
        rows = await self._fetch("SELECT id, channel_id FROM episodes WHERE forgotten_at >= ?",
                                 (since,))
        return {r["id"]: r["channel_id"] for r in rows}

    async def forgotten_among(self, episode_ids: set[int] | list[int]) -> set[int]:
        """Which of ``episode_ids`` have been forgotten (a night asks before it trains and
        before its release is recorded or promoted)."""
        wanted = sorted({int(i) for i in episode_ids})
        found: set[int] = set()
        for i in range(0, len(wanted), 500):  # SQLite's bound-parameter limit, with room
            chunk = wanted[i:i + 500]
            rows = await self._fetch(
                f"SELECT id FROM episodes WHERE forgotten_at IS NOT NULL AND id IN "
                f"({','.join('?' * len(chunk))})", tuple(chunk))
            found |= {r["id"] for r in rows}
        return found

    async def nights_trained_on(self, episode_id: int) -> set[int]:
        """The nights whose advantages name the episode (it was in their training set)."""
        rows = await self._fetch("SELECT DISTINCT night_id FROM advantages WHERE episode_id = ?",
                                 (episode_id,))
        return {r["night_id"] for r in rows}

    async def images_in_use(self, digests: set[str]) -> set[str]:
        """Which image hashes a step of an episode that is not forgotten still refers to
        (its cached file must stay)."""
        used = set()
        for digest in digests:
            rows = await self._fetch(
                "SELECT 1 FROM steps s JOIN episodes e ON e.id = s.episode_id WHERE "
                "e.forgotten_at IS NULL AND s.meta LIKE ? LIMIT 1", (f"%{digest}%",))
            if rows:
                used.add(digest)
        return used


async def _empty_summaries(db, episode: Episode) -> int:
    """Empty the compaction summaries of later episodes that read the episode: those whose
    payload names it among its ``sources``, and (events from before sources were stored)
    those of episodes whose steps were sent a prefix carrying its text."""
    refs = [r[0] for r in await db.execute_fetchall(
        "SELECT ref FROM prompt_prefixes WHERE EXISTS (SELECT 1 FROM "
        "json_each(prompt_prefixes.sources) WHERE json_each.value = ?)", (episode.id,))]
    readers: set[int] = set()
    for i in range(0, len(refs), 500):
        chunk = refs[i:i + 500]
        rows = await db.execute_fetchall(
            "SELECT DISTINCT episode_id FROM steps WHERE channel_id = ? AND "
            f"json_extract(meta, '$.context.prefix') IN ({','.join('?' * len(chunk))})",
            (episode.channel_id, *chunk))
        readers |= {r[0] for r in rows}
    cur = await db.execute(
        "UPDATE events SET payload = '{}' WHERE kind = ? AND payload != '{}' AND "
        "(EXISTS (SELECT 1 FROM json_each(events.payload, '$.sources') WHERE value = ?) "
        f"OR episode_id IN ({','.join('?' * len(readers)) or 'NULL'}))",
        (COMPACTION, episode.id, *sorted(readers)))
    return cur.rowcount


async def _delete_records(db, episode: Episode) -> int:
    """Delete the night ledger's records derived from the episode: those naming it in
    ``episodes``, its understanding score, and the channel's records from before records
    named their episodes (they cannot say whether they read it)."""
    cur = await db.execute(
        "DELETE FROM night_records WHERE "
        "EXISTS (SELECT 1 FROM json_each(night_records.payload, '$.episodes') "
        "WHERE value = ?) OR (kind = 'understanding' AND key = ?) OR "
        "(json_type(payload, '$.episodes') IS NULL AND kind IN ('judgment', 'prediction') "
        "AND substr(key, 1, length(?) + 1) = ? || ':')",
        (episode.id, str(episode.id), episode.channel_id, episode.channel_id))
    return cur.rowcount


def forgotten_sources_sql(placeholder: str) -> str:
    """SQL that is true when the JSON list ``placeholder`` names a forgotten episode: the
    writer and the ledger refuse such a prefix or record (their text would come back)."""
    return (f"EXISTS (SELECT 1 FROM json_each({placeholder}) j JOIN episodes e "
            "ON e.id = j.value WHERE e.forgotten_at IS NOT NULL)")

