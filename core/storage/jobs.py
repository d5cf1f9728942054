"""The store's jobs (nights, practice runs) and releases, mixed into ``Store``.

They use the store's connection helpers (``_write``, ``_fetch``); every write
is one transaction, committed before the method returns.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from core.storage.schema import JOB_STATES, RELEASE_STATES, check, dumps, nonempty, record


class JobBook:
    """Jobs and releases; see ``core.storage.store.Store``."""

    # -- jobs -----------------------------------------------------------------

    async def create_job(self, kind: str, args: dict) -> int:
        """Queue a job; the trainer process picks it up and reports through update_job."""
        nonempty(kind, "job kind")
        now = time.time()
        rows = await self._fetch(
            "INSERT INTO jobs (kind, args, state, created_at, updated_at) "
            "VALUES (?, ?, 'queued', ?, ?) RETURNING id",
            (kind, dumps(args, "job args"), now, now),
        )
        return rows[0]["id"]

    async def create_exclusive_job(self, kind: str, args: dict,
                                   active: tuple[str, ...]) -> tuple[int, dict | None]:
        """Queue a job unless one of ``kind`` is ``active``: (new id, None) or (its id, it).
        One IMMEDIATE transaction, so two requests at once never both start one."""
        for state in active:
            check(state, JOB_STATES, "job state")
        async with self._write() as db:
            rows = await db.execute_fetchall(
                f"SELECT * FROM jobs WHERE kind = ? AND state IN ({', '.join('?' * len(active))}) "
                "ORDER BY id DESC LIMIT 1", (kind, *active))
            if rows:
                return rows[0]["id"], record(rows[0], ("args", "progress"))
            now = time.time()
            rows = await db.execute_fetchall(
                "INSERT INTO jobs (kind, args, state, created_at, updated_at) VALUES "
                "(?, ?, 'queued', ?, ?) RETURNING id", (kind, dumps(args, "job args"), now, now))
            return rows[0]["id"], None

    async def update_job(
        self,
        job_id: int,
        state: str | None = None,
        progress: dict | None = None,
        error: str | None = None,
        pid: int | None = None,
    ) -> None:
        """Change the given fields (None leaves one as it is); always bumps
        updated_at, so a call with no fields is a heartbeat."""
        if state is not None:
            check(state, JOB_STATES, "job state")
        changes = {
            "updated_at": time.time(),
            "state": state,
            "progress": dumps(progress, "job progress"),
            "error": error,
            "pid": None if pid is None else int(pid),
        }
        changes = {column: v for column, v in changes.items() if v is not None}
        assignments = ", ".join(f"{column} = ?" for column in changes)
        rows = await self._fetch(
            f"UPDATE jobs SET {assignments} WHERE id = ? RETURNING id", (*changes.values(), job_id)
        )
        if not rows:
            raise ValueError(f"no job {job_id}")

    async def job(self, job_id: int) -> dict | None:
        rows = await self._fetch("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return record(rows[0], ("args", "progress")) if rows else None

    async def jobs(self, kind: str | None = None, states: list[str] | None = None) -> list[dict]:
        sql = "SELECT * FROM jobs WHERE 1"
        params: list[Any] = []
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        if states is not None:
            for state in states:
                check(state, JOB_STATES, "job state")
            sql += f" AND state IN ({', '.join('?' * len(states))})"
            params.extend(states)
        rows = await self._fetch(sql + " ORDER BY id", tuple(params))
        return [record(r, ("args", "progress")) for r in rows]

    # -- releases -------------------------------------------------------------

    async def add_release(self, name: str, path: str, meta: dict,
                          state: str = "candidate") -> int:
        """Record a trained model, as a candidate or already ``rejected`` by its gate: the
        gate's decision (in ``meta``) and the state go in with the row, in one statement,
        so no crash can leave a gate-failed release waiting as a candidate. Names are
        unique so that promote and rollback can name a release unambiguously."""
        nonempty(name, "release name")
        check(state, ("candidate", "rejected"), "new release state")
        now = time.time()
        try:
            rows = await self._fetch(
                "INSERT INTO releases (name, path, meta, state, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                (name, str(path), dumps(meta, "release meta"), state, now, now),
            )
        except sqlite3.IntegrityError:
            raise ValueError(f"a release named {name!r} already exists") from None
        return rows[0]["id"]

    async def set_release_state(self, release_id: int, state: str) -> None:
        """Making one release live retires the previous live one in the same
        transaction, so a reader never sees zero or two live releases."""
        check(state, RELEASE_STATES, "release state")
        now = time.time()
        async with self._write() as db:
            found = await db.execute_fetchall("SELECT 1 FROM releases WHERE id = ?", (release_id,))
            if not found:
                raise ValueError(f"no release {release_id}")
            if state == "live":
                await db.execute(
                    "UPDATE releases SET state = 'retired', updated_at = ? "
                    "WHERE state = 'live' AND id != ?",
                    (now, release_id),
                )
            await db.execute(
                "UPDATE releases SET state = ?, updated_at = ? WHERE id = ?",
                (state, now, release_id),
            )

    async def releases(self) -> list[dict]:
        rows = await self._fetch("SELECT * FROM releases ORDER BY id")
        return [record(r, ("meta",)) for r in rows]
