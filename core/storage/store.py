"""The trajectory store: one SQLite file holding what the agent saw and did.

The bot writes every step here before it moves on, and the trainer (another
process) reads the day back at night, so the file is the only contract
between them. Both import this module; it stays free of discord and torch.

Durability goal: a step acknowledged to the caller survives a SIGKILL of the
process. Power-loss durability is not a goal (see ``_open_pragmas``).

One ``Store`` owns one aiosqlite connection, i.e. one background thread that
runs statements in order, so the event loop never blocks on disk. Statements
from concurrent tasks would interleave on that connection, and a statement
run between another task's BEGIN and COMMIT would silently join (and maybe
roll back with) that transaction; every access therefore holds the Store's
own lock. SQLite admits one writer at a time anyway, so the lock costs no
parallelism. Other processes (the trainer) are kept apart by SQLite's file
locks and ``busy_timeout``.

The turns' hot writes (a turn's start, its steps, its end, its events) and
its history read go instead to the store's writer process, in group commits
(``core.storage.group_commit``): it has a connection of its own.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import aiosqlite

from core.storage.forgetting import ForgetBook
from core.storage.group_commit import GroupCommit
from core.storage.jobs import JobBook
from core.storage.labels import LabelBook
from core.storage.ledger import NightLedger
from core.storage.prefixes import Prefix, Prefixes
from core.storage.received import Received
from core.storage.toolsets import ToolSets

from core.storage.schema import (
    EPISODE_STATUSES,
    LABELS,
    Episode,
    SchemaTooNewError,
    Step,
    StoredStep,
    check,
    check_step,
    dumps,
    migrate,
    nonempty,
    record,
    step_values,
    stored_step,
)

__all__ = ["Episode", "Prefix", "SchemaTooNewError", "Step", "Store", "StoredStep"]

_BUSY_TIMEOUT_MS = 10_000


class Store(NightLedger, ToolSets, Prefixes, LabelBook, ForgetBook, JobBook):
    """Trajectories, labels, events, jobs and releases in one SQLite file."""

    busy_timeout_ms = _BUSY_TIMEOUT_MS

    def __init__(self, db: aiosqlite.Connection, path: str, schema_version: int,
                 commits: GroupCommit) -> None:
        # Use Store.open(): setup needs awaits, which __init__ cannot do.
        self._db = db
        self._path = path
        self._schema_version = schema_version
        self._lock = asyncio.Lock()
        self._closed = False
        # The turns' steps, ends, events and history reads: batched by the store's writer
        # process (core.storage.group_commit), which keeps the channels' recent steps.
        self._commits = commits
        self._received = Received()  # the steps the writer sent lately (reads come as ids)

    # -- lifetime -------------------------------------------------------------

    @classmethod
    async def open(cls, path: Path | str) -> Store:
        """Open (creating directories and file if needed) and migrate the store."""
        path = str(path)
        if path == ":memory:":  # refused before anything is opened
            raise ValueError("the store must be a file (core.storage.group_commit opens a "
                             "second connection to it)")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: sqlite3 must not open transactions behind our
        # back; single statements autocommit, multi-statement work uses _write.
        db = await aiosqlite.connect(path, isolation_level=None)
        try:
            db.row_factory = sqlite3.Row
            await cls._open_pragmas(db, path)
            version = await migrate(db, path)
            commits = GroupCommit(path, _BUSY_TIMEOUT_MS)  # after migrate: the schema is there
            await commits.start()
        except BaseException:
            await db.close()
            raise
        return cls(db, path, version, commits)

    @staticmethod
    async def _open_pragmas(db: aiosqlite.Connection, path: str) -> None:
        await db.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        async with db.execute("PRAGMA journal_mode = WAL") as cur:
            mode = (await cur.fetchone())[0]
        if mode.lower() != "wal":
            raise RuntimeError(f"store {path}: could not enable WAL (journal_mode is {mode})")
        # synchronous=NORMAL. In WAL mode a COMMIT has write()n its frames to
        # the -wal file before it returns; NORMAL only skips the fsync, which
        # happens at checkpoints instead. A SIGKILLed process's writes are
        # already in the kernel's page cache, which the kernel flushes
        # regardless, and the next open replays the WAL: every acknowledged
        # step survives a process crash (tests/test_store.py kills a writer
        # to check exactly that). What NORMAL gives up is the last few commits
        # on power loss or a kernel crash (rolled back, never corrupt), which
        # is not our goal. FULL would add an fsync to every step, i.e. a disk
        # flush per chat message, for durability we do not need.
        await db.execute("PRAGMA synchronous = NORMAL")
        await db.execute("PRAGMA foreign_keys = ON")
        # /forget erases on this connection: the bytes it frees are zeroed, not left in the
        # file's free pages (core.storage.forgetting). Erasures are rare, so it costs little.
        await db.execute("PRAGMA secure_delete = ON")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._commits.close()
        async with self._lock:
            await self._db.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def path(self) -> str:
        return self._path

    @property
    def schema_version(self) -> int:
        return self._schema_version

    # -- access helpers -------------------------------------------------------

    async def _fetch(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        """Run one statement to completion; alone, it is its own transaction.

        Fetching every row matters for INSERT ... RETURNING: the implicit
        transaction commits only when the statement has run to its end.
        """
        async with self._lock:
            return list(await self._db.execute_fetchall(sql, params))

    @asynccontextmanager
    async def _transaction(self, begin: str) -> AsyncIterator[aiosqlite.Connection]:
        async with self._lock:
            await self._db.execute(begin)
            try:
                yield self._db
            except BaseException:
                # SQLite itself rolls back on some errors (disk full, I/O);
                # a second ROLLBACK would then hide the real error.
                if self._db.in_transaction:
                    await self._db.execute("ROLLBACK")
                raise
            await self._db.execute("COMMIT")

    def _write(self) -> AbstractAsyncContextManager[aiosqlite.Connection]:
        # IMMEDIATE takes the write lock up front, so a transaction that reads
        # then writes cannot fail half-way with SQLITE_BUSY.
        return self._transaction("BEGIN IMMEDIATE")

    def _snapshot(self) -> AbstractAsyncContextManager[aiosqlite.Connection]:
        # SELECTs that must agree while another process keeps writing.
        return self._transaction("BEGIN")

    # -- channels and episodes ------------------------------------------------

    async def ensure_channel(self, channel_id: str, name: str = "") -> None:
        """Record a channel; a non-empty name replaces the stored one (renames)."""
        nonempty(channel_id, "channel_id")
        await self._fetch(
            "INSERT INTO channels (id, name, created_at) VALUES (?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET name = excluded.name WHERE excluded.name != ''",
            (channel_id, name, time.time()),
        )

    async def start_episode(self, channel_id: str, model_version: str | None = None) -> int:
        """Open an episode; the channel is recorded too, so callers need no ensure_channel."""
        nonempty(channel_id, "channel_id")
        now = time.time()
        async with self._write() as db:
            await db.execute(
                "INSERT OR IGNORE INTO channels (id, name, created_at) VALUES (?, '', ?)",
                (channel_id, now),
            )
            # The release that serves it is the live one: the bot serves what is live
            # (bot.runtime), and a swap marks the new release live once it serves.
            cur = await db.execute(
                "INSERT INTO episodes (channel_id, started_at, model_version, release_id) "
                "VALUES (?, ?, ?, (SELECT id FROM releases WHERE state = 'live'))",
                (channel_id, now, model_version),
            )
            return cur.lastrowid

    async def start_turn(self, channel_id: str, model_version: str | None,
                         steps: list[Step], name: str = "", prefix: Prefix | None = None
                         ) -> tuple[int, list[StoredStep]]:
        """Open an episode with its first steps (system prompt, user message) and the
        turn's prompt prefix in ONE commit: the bookkeeping of a turn's start costs one
        transaction, not four. Nothing is acknowledged before that commit; a failure
        leaves none of it."""
        nonempty(channel_id, "channel_id")
        for step in steps:
            check_step(step)
        now = time.time()

        # Plain values cross to the writer, never objects it might fail to load: the
        # episode id, which only the writer knows, goes in at the end of each.
        episode_id, stored = await self._commits.run(
            "start_turn", channel_id, name, now, model_version,
            None if prefix is None else prefix.values(),
            [step_values(step, None) for step in steps])
        self._received.add(stored)
        return episode_id, stored

    async def end_episode(self, episode_id: int, status: str) -> None:
        """Close an open episode. Ending it twice is refused: two owners of one
        episode is a harness bug, and the second status would hide the first."""
        check(status, (s for s in EPISODE_STATUSES if s != "open"), "episode status")
        await self._commits.run("end_episode", episode_id, status, time.time())

    async def add_step(self, episode_id: int, step: Step, prefix: Prefix | None = None
                       ) -> StoredStep:
        """Append a step and return it once it is committed (group commit); ``prefix``, the
        prompt prefix its meta refers to (``core.storage.prefixes``), is stored with it, once.

        The seq is computed inside the same INSERT, so concurrent writers (even
        from two processes) can never give one episode a gap or a duplicate;
        the UNIQUE (episode_id, seq) index would refuse a duplicate anyway.
        Steps go only to open episodes: a step after the end would make the
        stored trajectory differ from the one that was labelled.
        """
        check_step(step)
        stored = await self._commits.run("add_step", episode_id, step_values(step, episode_id),
                                         None if prefix is None else prefix.values())
        self._received.add([stored])
        return stored

    async def channel_history(self, channel_id: str, limit: int) -> list[StoredStep]:
        """The channel's last ``limit`` steps across episodes, oldest first; forgotten
        episodes are left out. Read in the group commit's queue: it sees every step
        acknowledged before it was asked, and costs no hop of its own. The writer
        answers from its memory when it can (``core.storage.history``), by ids of steps
        this process was sent (``core.storage.received``); the steps are shared, so
        callers must not change them."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        kind, found = await self._commits.run("channel_history", channel_id, limit)
        if kind == "ids":
            steps = self._received.steps(channel_id, found)
            if steps is not None:
                return steps
            kind, found = await self._commits.run("channel_history", channel_id, limit, True)
        self._received.replace(channel_id, found, limit)
        return found

    async def episodes_since(self, since: float, channel_id: str | None = None) -> list[Episode]:
        """Episodes started or ended at or after ``since``, with steps and labels.

        "Or ended" matters: an episode still open when one night collected was
        excluded as incomplete, and must be seen by the next night once it ends.
        Ordered by start time.
        """
        where = "(started_at >= ? OR ended_at >= ?)"
        params: tuple = (since, since)
        if channel_id is not None:
            where += " AND channel_id = ?"
            params += (channel_id,)
        chosen = f"SELECT id FROM episodes WHERE {where}"
        async with self._snapshot() as db:
            episode_rows = await db.execute_fetchall(
                f"SELECT * FROM episodes WHERE {where} ORDER BY started_at, id", params
            )
            step_rows = await db.execute_fetchall(
                f"SELECT * FROM steps WHERE episode_id IN ({chosen}) ORDER BY episode_id, seq",
                params,
            )
            label_rows = await db.execute_fetchall(
                f"SELECT episode_id, label, user_id FROM labels WHERE episode_id IN ({chosen}) "
                "ORDER BY id",
                params,
            )
        episodes = {r["id"]: Episode(**dict(r)) for r in episode_rows}
        for r in step_rows:
            episodes[r["episode_id"]].steps.append(stored_step(r))
        for r in label_rows:
            episodes[r["episode_id"]].labels.append(r["label"])
            episodes[r["episode_id"]].labellers.append(r["user_id"])
        await self._expand_tool_sets(list(episodes.values()))
        return list(episodes.values())

    async def count_episodes_since(self, since: float) -> int:
        """How many episodes ``episodes_since(since)`` would return, counted by SQLite:
        the sleep schedule asks every few seconds, and loading a whole day's steps on
        the event loop to count them grew with the day."""
        rows = await self._fetch("SELECT COUNT(*) FROM episodes WHERE started_at >= ? "
                                 "OR ended_at >= ?", (since, since))
        return int(rows[0][0])

    async def episode_status(self, episode_id: int) -> str | None:
        """One episode's status ("open", "complete", ...), or None when there is none."""
        rows = await self._fetch("SELECT status FROM episodes WHERE id = ?", (episode_id,))
        return rows[0]["status"] if rows else None

    async def add_label(self, episode_id: int, label: str, source: str,
                        user_id: int | None = None) -> None:
        """Attach a label; ``source`` says how it was given (reaction, admin, verifier),
        ``user_id`` by whom (a reaction's giver, who alone may take it back)."""
        check(label, LABELS, "label")
        nonempty(source, "label source")
        rows = await self._fetch(
            "INSERT INTO labels (episode_id, label, source, created_at, user_id) "
            "SELECT id, ?, ?, ?, ? FROM episodes WHERE id = ? RETURNING id",
            (label, source, time.time(), user_id, episode_id),
        )
        if not rows:
            raise ValueError(f"no episode {episode_id}")

    # -- events ---------------------------------------------------------------

    async def add_event(
        self, channel_id: str, episode_id: int | None, kind: str, payload: dict
    ) -> int:
        """Record something that happened in a channel but is not a message
        (e.g. a stray end-of-turn), for the night to turn into signals."""
        nonempty(channel_id, "channel_id")
        nonempty(kind, "event kind")
        values = (channel_id, episode_id, kind, dumps(payload, "event payload"), time.time(),
                  episode_id, episode_id)
        return await self._commits.run("add_event", values)

    async def events(self, kind: str | None = None, since: float = 0.0,
                     episode_id: int | None = None) -> list[dict]:
        sql = "SELECT * FROM events WHERE created_at >= ?"
        params: tuple = (since,)
        if kind is not None:
            sql += " AND kind = ?"
            params += (kind,)
        if episode_id is not None:
            sql += " AND episode_id = ?"
            params += (episode_id,)
        rows = await self._fetch(sql + " ORDER BY id", params)
        return [record(r, ("payload",)) for r in rows]

    # -- health ---------------------------------------------------------------

    async def integrity_check(self) -> str:
        """"ok", or SQLite's description of what is broken (pages or foreign keys)."""
        rows = await self._fetch("PRAGMA integrity_check")
        result = "\n".join(str(r[0]) for r in rows)
        if result != "ok":
            return result
        broken = await self._fetch("PRAGMA foreign_key_check")
        if broken:
            return "\n".join(
                f"{r['table']} row {r['rowid']}: missing {r['parent']} row" for r in broken
            )
        return "ok"
