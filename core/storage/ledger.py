"""The night's ledger in the store: finished work items and the advantages table.

Mixed into ``Store`` (it uses the store's locked ``_fetch`` and ``_write``).
A night writes each judged window, prediction and understanding score here as
soon as it is done, so a crashed night resumes without doing them twice.

Where a new night starts collecting (``next_night_since``): where the last
*promoted* night's collection ended (``progress.collected_until`` of the
newest night job that went ``live``), or the beginning. So a rejected,
inconclusive, failed or cancelled night consumes nothing: the next night
collects its episodes again, with everything since. Which of them it trains
on is the trainer's rule (episodes served by its base release).
"""

from __future__ import annotations

import time

from core.storage.forgetting import forgotten_sources_sql
from core.storage.schema import dumps, loads, record


class NightLedger:
    async def put_record(self, night_id: int, kind: str, key: str, payload: dict) -> bool:
        """Remember one finished work item of a night (a judged window, a prediction...).

        ``payload["episodes"]`` lists the episodes whose text it was made from, so that
        ``/forget`` can delete it; one naming an episode forgotten meanwhile is not stored
        (False): the night judged it before the forget, and must not keep what it wrote."""
        rows = await self._fetch(
            "INSERT OR REPLACE INTO night_records (night_id, kind, key, payload, created_at) "
            "SELECT ?1, ?2, ?3, ?4, ?5 WHERE NOT "
            + forgotten_sources_sql("json_extract(?4, '$.episodes')") + " RETURNING night_id",
            (night_id, kind, key, dumps(payload, "record"), time.time()))
        return bool(rows)

    async def records(self, night_id: int, kind: str) -> dict[str, dict]:
        rows = await self._fetch("SELECT key, payload FROM night_records WHERE night_id = ? "
                                 "AND kind = ? ORDER BY rowid", (night_id, kind))
        return {r["key"]: record(r, ("payload",))["payload"] for r in rows}

    async def save_advantages(self, night_id: int, rows: list[dict]) -> None:
        """Replace a night's advantages: rows of episode_id, step_id, advantage, parts."""
        async with self._write() as db:
            await db.execute("DELETE FROM advantages WHERE night_id = ?", (night_id,))
            await db.executemany(
                "INSERT INTO advantages (night_id, episode_id, step_id, advantage, parts) "
                "VALUES (?, ?, ?, ?, ?)",
                [(night_id, r["episode_id"], r["step_id"], float(r["advantage"]),
                  dumps(r.get("parts", {}), "parts")) for r in rows])

    async def advantages(self, night_id: int) -> list[dict]:
        rows = await self._fetch("SELECT * FROM advantages WHERE night_id = ? ORDER BY step_id",
                                 (night_id,))
        return [record(r, ("parts",)) for r in rows]

    async def next_night_since(self) -> float:
        """Where the next night collects from: the end of the last promoted night's
        collection, or 0 (everything) before any night was promoted."""
        rows = await self._fetch("SELECT progress FROM jobs WHERE kind = 'sleep' AND "
                                 "state = 'live' ORDER BY id DESC LIMIT 1")
        if not rows:
            return 0.0
        return float((loads(rows[0]["progress"]) or {}).get("collected_until") or 0.0)
