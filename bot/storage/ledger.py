"""The night's ledger in the store: finished work items and the advantages table.

Mixed into ``Store`` (it uses the store's locked ``_fetch`` and ``_write``).
A night writes each judged window, prediction and understanding score here as
soon as it is done, so a crashed night resumes without doing them twice.
"""

from __future__ import annotations

import time

from bot.storage.schema import dumps, record


class NightLedger:
    async def put_record(self, night_id: int, kind: str, key: str, payload: dict) -> None:
        """Remember one finished work item of a night (a judged window, a prediction...)."""
        await self._fetch(
            "INSERT OR REPLACE INTO night_records (night_id, kind, key, payload, created_at) "
            "VALUES (?, ?, ?, ?, ?)", (night_id, kind, key, dumps(payload, "record"), time.time()))

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
