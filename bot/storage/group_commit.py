"""Group commit: many channels' steps committed in one transaction, each acknowledged
only once that transaction has committed.

A turn's bookkeeping is a handful of small writes (open the episode with its
system prompt and message, the answer, the end) and a read (the channel's
history). Done one by one through aiosqlite, each is a hop to the database
thread and back (a queue put, a thread wake-up, a self-pipe write to wake the
loop) and each write its own commit. With 50 channels those hops, not SQLite,
were most of the harness's cost per turn (bench/agent.py).

So the turn's operations go to one queue. A drain task takes everything that
is waiting and runs it in ONE call on this module's own thread, inside one
``BEGIN IMMEDIATE ... COMMIT``:

- one operation that raises (a step for an episode that has ended) is rolled
  back alone and its caller gets the error; the others commit (the batch is
  then run again with a SAVEPOINT around each operation; see ``_commit``);
- every caller's future is resolved only after COMMIT has returned, so a step
  is acknowledged only once it is committed, as before (durability: see
  ``Store._open_pragmas``; the same pragmas are set here);
- if BEGIN or COMMIT fails (the disk is full, another process holds the write
  lock past the busy timeout), every caller in the batch gets that error and
  none of the batch is stored;
- operations run in the order they were queued, so a read sees every write
  queued before it, including those of its own batch.

An operation is a plain function of a ``sqlite3.Connection``: it must do only
database work (it runs on the commit thread, and blocks the batch while it
runs). A caller cancelled before its operation was taken is dropped (never run,
never acknowledged); one cancelled later may still be committed, as a cancelled
aiosqlite call could be.

The thread has its own connection to the same file (WAL): readers on the
store's aiosqlite connection see a commit once it is acknowledged, and the two
connections' writes are kept apart by SQLite's lock and busy timeout, as the
trainer's are. An in-memory database cannot be shared between connections, so
the store must be a file.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
Operation = Callable[[sqlite3.Connection], Any]

# A bound on one transaction's size, so one batch never holds the write lock for long.
MAX_BATCH = 256


class GroupCommit:
    """One commit thread and connection; ``run(op)`` queues ``op`` and waits for its commit."""

    def __init__(self, path: str, busy_timeout_ms: int,
                 on_begin: Callable[[sqlite3.Connection], None] = lambda conn: None,
                 on_rollback: Callable[[], None] = lambda: None) -> None:
        if path == ":memory:":
            raise ValueError("the store must be a file: group commit opens a second "
                             "connection, and an in-memory database cannot be shared")
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        # Called on the commit thread once a batch's transaction has begun (it holds the
        # write lock): what memory keeps checks there whether another connection wrote.
        self._on_begin = on_begin
        # Called on the commit thread when a batch is rolled back whole: what was kept in
        # memory from its operations (bot.storage.history) is not in the file.
        self._on_rollback = on_rollback
        self._pending: list[tuple[Operation, asyncio.Future]] = []
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="store-commit")
        self._conn: sqlite3.Connection | None = None  # made and used on the commit thread only
        self._task: asyncio.Task | None = None
        self._closed = False
        self.batches = 0  # transactions committed (or failed): for benches and tests
        self.operations = 0

    async def run(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op`` in the next group transaction; its result once that has committed."""
        if self._closed:
            raise RuntimeError("the store is closed")
        future = asyncio.get_running_loop().create_future()
        self._pending.append((op, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="store-group-commit")
        self._wake.set()
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        batch: list[tuple[Operation, asyncio.Future]] = []
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._pending:
                    batch = [(op, f) for op, f in self._pending[:MAX_BATCH] if not f.cancelled()]
                    del self._pending[:MAX_BATCH]
                    if not batch:
                        continue
                    # Not cancelled by close(), which waits: a batch taken is a batch answered.
                    results = await loop.run_in_executor(self._executor, self._commit,
                                                         [op for op, _ in batch])
                    for (_, future), (ok, value) in zip(batch, results):
                        if future.done():
                            continue
                        if ok:
                            future.set_result(value)
                        else:
                            future.set_exception(value)
                    batch = []
                if self._closed:
                    return
        except BaseException:
            # Cancelled with the loop, or a bug here: no caller may wait forever, and none
            # is told its operation was committed (a taken batch may or may not have been).
            for _, future in batch + self._pending:
                if not future.done():
                    future.set_exception(RuntimeError("the store's commit task stopped"))
            self._pending.clear()
            raise

    # -- on the commit thread ---------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self._path, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            conn.execute("PRAGMA synchronous = NORMAL")  # see Store._open_pragmas
            conn.execute("PRAGMA foreign_keys = ON")
            self._conn = conn
        return self._conn

    def _commit(self, ops: list[Operation]) -> list[tuple[bool, Any]]:
        """Run ``ops`` in one transaction: (True, result) or (False, exception) each.

        Optimistic: the batch runs first with no savepoint per operation (a savepoint
        and its release are two statements more for each, about a third of a turn's
        SQLite time in bench/agent.py). Only if one raises is the whole batch undone,
        what memory kept from it dropped (``on_rollback``), and the batch run again
        with a savepoint around each, so that the failing one alone is undone.
        Operations are plain functions of the connection, so running one again after
        a rollback is running it for the first time."""
        self.batches += 1
        self.operations += len(ops)
        try:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            self._on_begin(conn)
            # One savepoint for the whole batch: undoing it keeps the transaction, so the
            # write lock is not let go (and maybe lost to another writer) for the rerun.
            conn.execute("SAVEPOINT batch")
            try:
                results = [(True, op(conn)) for op in ops]
            except Exception:  # one operation's own error: undo all, then isolate it
                self._on_rollback()
                if conn.in_transaction:
                    conn.execute("ROLLBACK TO batch")
                else:  # SQLite rolled it all back itself: begin again
                    conn.execute("BEGIN IMMEDIATE")
                self._on_begin(conn)
                results = [self._one(conn, op) for op in ops]
            conn.execute("COMMIT")
        except Exception as exc:  # nothing of the batch is stored: every caller hears why
            self._on_rollback()
            if self._conn is not None and self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            return [(False, exc)] * len(ops)
        return results

    @staticmethod
    def _one(conn: sqlite3.Connection, op: Operation) -> tuple[bool, Any]:
        conn.execute("SAVEPOINT op")
        try:
            value = op(conn)
        except Exception as exc:  # the operation's own error: undo it alone
            # If SQLite itself rolled the whole transaction back (I/O error, disk
            # full), ROLLBACK TO fails and the batch fails with that error.
            conn.execute("ROLLBACK TO op")
            conn.execute("RELEASE op")
            return False, exc
        conn.execute("RELEASE op")
        return True, value

    # -- lifetime ---------------------------------------------------------------

    async def close(self) -> None:
        """Commit what is queued, then stop the thread and close its connection."""
        if self._closed:
            return
        self._closed = True  # no new operations; the drain commits the queued ones and returns
        if self._task is not None:
            self._wake.set()
            await self._task
            self._task = None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_connection)
        self._executor.shutdown(wait=True)

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
