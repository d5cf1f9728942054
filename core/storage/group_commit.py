"""Group commit: many channels' steps committed in one transaction, by a writer process
of the store's own, each acknowledged only once that transaction has committed.

A turn's bookkeeping is a handful of small writes (open the episode with its
system prompt and message, the answer, the end) and a read (the channel's
history). Done one by one, each is a hop and its own commit. So the turn's
operations are sent, by name (``core.storage.operations``), to one writer, which
runs whatever is waiting in ONE ``BEGIN IMMEDIATE ... COMMIT`` (``Batcher``):

- one operation that raises (a step for an episode that has ended) is rolled
  back alone and its caller gets the error; the others commit (the batch is
  then run again with a SAVEPOINT around each operation; see ``_commit``);
- every caller's future is resolved only after COMMIT has returned, so a step
  is acknowledged only once it is committed (durability: see
  ``Store._open_pragmas``; the same pragmas are set here);
- if BEGIN or COMMIT fails (the disk is full, another process holds the write
  lock past the busy timeout), every caller in the batch gets that error and
  none of the batch is stored;
- operations run in the order they were sent, so a read sees every write sent
  before it, including those of its own batch.

**Why a process, not a thread.** It was a thread, and the bench showed the
thread ~75% busy, waiting for Python's GIL for almost half of that: each
SQLite statement lets the GIL go and must take it back from the event loop,
which holds it for most of a turn. In a process of its own the writer has
its own interpreter (the second core), and the bot's loop only pickles a
request and unpickles an answer (``bench/agent.py``: see the README).

The writer (``python -m core.storage.writer``) is a child of the bot, in a
session of its own so that a Ctrl-C meant for the console does not cut a
batch in half. It answers a batch with one frame; the bot matches answers to
callers in order. It stops at the end of its input: ``close`` (every queued
operation committed first), or the bot's death (what it had read is
committed; nobody was told). If the writer dies (killed, out of memory), every
waiting caller hears why (its operation may or may not have been committed),
and the next operation starts a new writer. A caller cancelled after its
request was sent may still be committed, as a cancelled call to a database
thread could be.

Pickles cross only between the bot and its own child, over pipes that nothing
else holds: text from Discord or a file is a string inside them, never a
pickle that is loaded.

The writer has its own connection to the same file (WAL): readers on the
store's aiosqlite connection see a commit once it is acknowledged, and the two
connections' writes are kept apart by SQLite's lock and busy timeout, as the
trainer's are. An in-memory database cannot be shared between connections, so
the store must be a file.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import sqlite3
import struct
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

Operation = Callable[[sqlite3.Connection], Any]
Result = tuple[bool, Any]  # (True, value) or (False, the exception it raised)

# A bound on one transaction's size, so one batch never holds the write lock for long.
MAX_BATCH = 256
# How long close() waits for the writer to answer what was sent, then end: a few batches
# that each wait out SQLite's busy timeout (10 s) for another process's lock.
CLOSE_TIMEOUT_S = 60.0
FRAME_HEADER = struct.Struct(">I")  # a frame: its length, then a pickle
_ROOT = Path(__file__).resolve().parents[2]
logger = logging.getLogger("nightshift.store")


def frame(value: Any) -> bytes:
    data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    return FRAME_HEADER.pack(len(data)) + data


def _refuse_memory(path: str) -> None:
    if path == ":memory:":
        raise ValueError("the store must be a file: group commit opens a second "
                         "connection, and an in-memory database cannot be shared")


class Batcher:
    """One connection that runs batches of operations, each batch one transaction. The
    writer process runs it; it is plain and synchronous, so tests run it directly."""

    def __init__(self, path: str, busy_timeout_ms: int,
                 on_begin: Callable[[sqlite3.Connection], None] = lambda conn: None,
                 on_rollback: Callable[[], None] = lambda: None) -> None:
        _refuse_memory(path)
        # Called once a batch's transaction has begun (it holds the write lock): what
        # memory keeps checks there whether another connection wrote.
        self._on_begin = on_begin
        # Called when a batch is rolled back whole: what memory kept from its
        # operations (core.storage.history) is not in the file.
        self._on_rollback = on_rollback
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        self.conn.execute("PRAGMA synchronous = NORMAL")  # see Store._open_pragmas
        self.conn.execute("PRAGMA foreign_keys = ON")

    def commit(self, ops: list[Operation]) -> list[Result]:
        """Run ``ops`` in one transaction: (True, result) or (False, exception) each.

        Optimistic: the batch runs first with no savepoint per operation (a savepoint
        and its release are two statements more for each, about a third of a turn's
        SQLite time in bench/agent.py). Only if one raises is the whole batch undone,
        what memory kept from it dropped (``on_rollback``), and the batch run again
        with a savepoint around each, so that the failing one alone is undone.
        Operations are plain functions of the connection, so running one again after
        a rollback is running it for the first time."""
        conn = self.conn
        try:
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
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return [(False, exc)] * len(ops)
        return results

    @staticmethod
    def _one(conn: sqlite3.Connection, op: Operation) -> Result:
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

    def close(self) -> None:
        self.conn.close()


class GroupCommit:
    """The bot's side: ``run(name, *args)`` sends an operation to the writer process and
    waits for its commit. ``start()`` before use, ``close()`` after."""

    def __init__(self, path: str, busy_timeout_ms: int) -> None:
        _refuse_memory(path)
        self._path, self._busy_timeout_ms = path, busy_timeout_ms
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._waiting: deque[asyncio.Future] = deque()  # in the order sent
        self._outbox: list[bytes] = []  # frames sent together at the end of this loop turn
        self._closed = False
        self._stopped: str | None = None  # why the writer is gone, once it is
        self._restarting = asyncio.Lock()
        self.restarts = 0
        self.batches = 0  # transactions committed (or failed): for benches and tests
        self.operations = 0

    async def start(self) -> None:
        """Start the writer and wait until its connection is open (or say why not)."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        self._proc = proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "core.storage.writer", self._path, str(self._busy_timeout_ms),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            start_new_session=True, limit=1 << 24)
        try:
            [(ok, value)] = await self._answer()
        except BaseException as exc:  # cancelled, or it died or said something else: no orphan
            await _end(proc)
            if isinstance(exc, Exception):
                raise RuntimeError(f"the store's writer process did not start (exit "
                                   f"{proc.returncode}; its error is on stderr)") from None
            raise
        if not ok:
            await _end(proc)
            raise value
        self._reader = asyncio.create_task(self._read(), name="store-writer-answers")

    async def run(self, name: str, *args: Any) -> Any:
        """Run operation ``name`` (``core.storage.operations``) in the next group
        transaction; its result once that has committed."""
        if self._stopped is not None:
            await self._restart()
        if self._closed:  # checked after the restart too: close() may have run meanwhile
            raise RuntimeError("the store is closed")
        try:
            request = frame((name, args))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise ValueError(f"store operation {name}: its arguments cannot be sent to the "
                             f"writer: {exc}") from None
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        if not self._outbox:  # the first this turn of the loop: send them all after it
            asyncio.get_running_loop().call_soon(self._send)
        self._outbox.append(request)
        return await future

    async def _restart(self) -> None:
        async with self._restarting:  # one new writer for all the callers that find it gone
            if self._stopped is None or self._closed:
                return
            logger.warning("%s; starting a new one", self._stopped)
            await _end(self._proc)  # no longer answered: it must not write behind the new one
            await self.start()
            self._stopped = None
            self.restarts += 1

    def _send(self) -> None:
        data, self._outbox = b"".join(self._outbox), []
        if self._stopped is None and not self._proc.stdin.is_closing():
            self._proc.stdin.write(data)  # if the writer is gone, _read fails the callers

    async def _answer(self) -> list[Result]:
        header = await self._proc.stdout.readexactly(FRAME_HEADER.size)
        (size,) = FRAME_HEADER.unpack(header)
        return pickle.loads(await self._proc.stdout.readexactly(size))

    async def _read(self) -> None:
        try:
            while True:
                results = await self._answer()
                self.batches += 1
                self.operations += len(results)
                for ok, value in results:
                    future = self._waiting.popleft()
                    if future.done():  # its caller was cancelled
                        continue
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
        except asyncio.IncompleteReadError:  # the writer ended its output: it stopped
            code = await self._proc.wait()
            self._stop(f"the store's writer process stopped (exit {code})")
        except BaseException as exc:
            # Cancelled with the loop, or a bug here: no caller may wait forever, and none
            # is told its operation was committed (a sent batch may or may not have been).
            self._stop(f"the store's writer is no longer answered: {exc!r}")
            raise

    def _stop(self, why: str) -> None:
        self._stopped = why
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(RuntimeError(why))

    async def close(self) -> None:
        """Commit what was sent, then stop the writer (it stops at the end of its input)."""
        if self._closed:
            return
        self._closed = True
        async with self._restarting:  # a restart under way finishes first, then is closed
            if self._proc is None:
                return
            if self._outbox:
                self._send()
            if not self._proc.stdin.is_closing():
                self._proc.stdin.close()
            if self._reader is not None:
                try:  # it answers everything sent, then ends
                    await asyncio.wait_for(asyncio.shield(self._reader), CLOSE_TIMEOUT_S)
                except TimeoutError:
                    logger.error("the store's writer did not finish in %.0f s; it is killed, "
                                 "and what it had not answered may not be stored",
                                 CLOSE_TIMEOUT_S)
                    await _end(self._proc)
                    await self._reader
                self._reader = None
            await _end(self._proc)


async def _end(proc: asyncio.subprocess.Process | None) -> None:
    """``proc`` stopped: killed if it still runs, and waited for."""
    if proc is None:
        return
    if proc.returncode is None:
        try:
            proc.kill()
        except ProcessLookupError:  # it ended between the check and the kill
            pass
    await proc.wait()
