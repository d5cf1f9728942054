"""The channels' recent steps, kept in memory by the store's writer process.

Every turn reads its channel's last ~20 steps back (``Store.channel_history``).
Read from SQLite, that is 20 rows turned back into steps with their JSON, on
every turn: it was about half of the store's commit work per turn
(bench/agent.py). Those steps were, almost always, written a moment before by
the writer's own connection, so the cache keeps them as they were stored.

It stays honest with three rules:

- **Other connections.** ``PRAGMA data_version`` changes when any other
  connection (the store's own aiosqlite one, the trainer, a second bot
  process) commits to the file. Each group-commit batch checks it once, right
  after its ``BEGIN IMMEDIATE`` (``sync``), and empties the cache when it
  moved: ``/forget``, an erasure or another writer's step is seen exactly as
  SQLite would show it. Once is enough: the batch holds the write lock until
  its COMMIT, so no other connection can commit in between, and a check per
  read was a statement more on every turn.
- **This connection's writes.** A step is appended only by the operation that
  inserted it, as its last action, so a step whose operation raised never
  enters. A batch rolled back whole (its COMMIT failed, or one operation raised
  and the batch is run again apart) empties the cache
  (``Batcher(on_rollback=...)``).
- **Bounds.** At most ``keep`` steps for each of at most ``channels``
  channels, the least recently used dropped first; a read for more than is
  kept goes to SQLite.

The same rules keep ``names``: each channel's name as this connection last
wrote it, so that a turn's start (``core.storage.operations.start_turn``) skips
the channel upsert when it would change nothing: a statement fewer on every
turn.

Everything here runs in the writer process, one batch at a time, so it needs
no lock. What a read returns goes to the bot pickled, or as step ids
(``core.storage.received``).
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict

from core.storage.schema import StoredStep, stored_step


class _Kept:
    __slots__ = ("steps", "complete")

    def __init__(self, steps: list[StoredStep], complete: bool) -> None:
        self.steps = steps  # oldest first
        self.complete = complete  # True: these are all of the channel's (unforgotten) steps


class HistoryCache:
    def __init__(self, keep: int = 64, channels: int = 512) -> None:
        self.keep, self.channels = keep, channels
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._version: int | None = None
        # channel -> the name this connection last upserted (operations.start_turn); bounded
        # like the steps, since a long-lived bot may see many channels.
        self.names: OrderedDict[str, str] = OrderedDict()
        self.hits = self.misses = 0  # for tests and benches

    def sync(self, db: sqlite3.Connection) -> None:
        """Forget everything if another connection committed since the last batch; called
        once per batch, inside its transaction (see the module docstring)."""
        version = db.execute("PRAGMA data_version").fetchone()[0]
        if version != self._version:
            self.clear()
            self._version = version

    def knows_name(self, channel_id: str, name: str) -> bool:
        """True when the channel's row is known to exist with this name already: an
        upsert of ``name`` would change nothing."""
        return self.names.get(channel_id) == name

    def wrote_name(self, channel_id: str, name: str) -> None:
        """This connection upserted the channel with ``name``: called as the operation's
        last action, as ``appended`` is, so an operation that raised leaves nothing."""
        self.names[channel_id] = name
        self.names.move_to_end(channel_id)
        while len(self.names) > self.channels:
            self.names.popitem(last=False)

    def lookup(self, channel_id: str, limit: int) -> list[StoredStep] | None:
        """The channel's last ``limit`` steps from memory, or None when they are not all
        known. Only in a batch that ``sync`` began."""
        kept = self._kept.get(channel_id)
        if kept is not None and (kept.complete or len(kept.steps) >= limit):
            self._kept.move_to_end(channel_id)
            self.hits += 1
            return kept.steps[-limit:] if limit else []
        return None

    def read(self, db: sqlite3.Connection, channel_id: str, limit: int) -> list[StoredStep]:
        """The channel's last ``limit`` steps, oldest first: from memory when they are
        known, else from SQLite (``read_history``), whose answer is then kept. Only in a
        batch that ``sync`` began."""
        found = self.lookup(channel_id, limit)
        if found is not None:
            return found
        self.misses += 1
        steps = read_history(db, channel_id, max(limit, self.keep))
        complete = len(steps) < max(limit, self.keep)
        if limit <= self.keep:
            self._put(channel_id, _Kept(steps[-self.keep:], complete))
        return steps[-limit:] if limit else []

    def appended(self, step: StoredStep) -> None:
        """``step`` was just inserted by this connection (in the current transaction)."""
        kept = self._kept.get(step.channel_id)
        if kept is None:
            return  # not read yet: the next read goes to SQLite, which has it
        kept.steps.append(step)
        if len(kept.steps) > self.keep:
            del kept.steps[0]
            kept.complete = False

    def clear(self) -> None:
        self._kept.clear()
        self.names.clear()
        self._version = None

    def _put(self, channel_id: str, kept: _Kept) -> None:
        self._kept[channel_id] = kept
        self._kept.move_to_end(channel_id)
        while len(self._kept) > self.channels:
            self._kept.popitem(last=False)


def read_history(db: sqlite3.Connection, channel_id: str, limit: int) -> list[StoredStep]:
    """The channel's last ``limit`` unforgotten steps from SQLite, oldest first."""
    cursor = db.cursor()
    cursor.row_factory = None  # plain tuples, named once below: the hot read of a turn
    rows = cursor.execute(
        # A join, not "NOT IN (forgotten episodes)": that scanned every episode on every
        # turn; this reads the last ``limit`` steps by index, newest first, and they are
        # put in order here rather than sorted by SQLite.
        "SELECT s.* FROM steps s JOIN episodes e ON e.id = s.episode_id "
        "WHERE s.channel_id = ? AND e.forgotten_at IS NULL ORDER BY s.id DESC LIMIT ?",
        (channel_id, limit)).fetchall()
    names = [column[0] for column in cursor.description]
    return [stored_step(dict(zip(names, r))) for r in reversed(rows)]

