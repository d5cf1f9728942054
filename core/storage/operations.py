"""The store's hot writes and its history read, as the writer process runs them.

Each operation is a plain function of the writer's connection, its memory
(``core.storage.history.HistoryCache``) and arguments that pickle, named in
``OPERATIONS``: the bot process asks for one by name over a pipe
(``core.storage.group_commit``), and the writer runs it inside a group
transaction. An operation raises ``ValueError`` for its caller's mistake (a
step for an ended episode); it is then undone alone.

Memory is touched only as an operation's last actions, so that one which
raises leaves nothing there (``HistoryCache``'s rules).

A forgotten episode (``core.storage.forgetting``) takes nothing more: a step for it
raises ``EpisodeForgotten`` (the turn that was still running stops there), its end is
a no-op (the forget closed it), its events are stored with an empty payload, and a
prompt prefix or compaction summary that names it among its sources is not stored.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Callable

from core.storage.forgetting import KEPT_EVENTS, EpisodeForgotten, forgotten_sources_sql
from core.storage.history import HistoryCache
from core.storage.prefixes import INSERT_PREFIX
from core.storage.schema import StoredStep, insert_step


def missing_or_closed(db: sqlite3.Connection, episode_id: int) -> ValueError:
    row = db.execute("SELECT status, forgotten_at FROM episodes WHERE id = ?",
                     (episode_id,)).fetchone()
    if row is None:
        return ValueError(f"no episode {episode_id}")
    if row["forgotten_at"] is not None:
        return EpisodeForgotten(episode_id)
    return ValueError(f"episode {episode_id} is already {row['status']}, not open")


def start_turn(db: sqlite3.Connection, memory: HistoryCache, channel_id: str, name: str,
               now: float, model_version: str | None, prefix: tuple | None,
               steps: list[tuple]) -> tuple[int, list[StoredStep]]:
    """The channel (upserted when its name may have changed), a new episode, the turn's
    prompt prefix (``Prefix.values()``) and its first steps (``step_values`` without the
    episode, which is made here)."""
    if not memory.knows_name(channel_id, name):
        db.execute(
            "INSERT INTO channels (id, name, created_at) VALUES (?, ?, ?) ON CONFLICT "
            "(id) DO UPDATE SET name = excluded.name WHERE excluded.name NOT IN ('', name)",
            (channel_id, name, now))
    episode_id = db.execute(  # the release that serves it: the live one (Store.start_episode)
        "INSERT INTO episodes (channel_id, started_at, model_version, release_id) "
        "VALUES (?, ?, ?, (SELECT id FROM releases WHERE state = 'live'))",
        (channel_id, now, model_version)).lastrowid
    if prefix is not None:
        db.execute(INSERT_PREFIX, prefix)
    stored = [insert_step(db, (*values[:-1], episode_id)) for values in steps]
    for step in stored:  # the last actions: nothing after them can roll them back
        memory.appended(step)
    memory.wrote_name(channel_id, name)
    return episode_id, stored


def end_episode(db: sqlite3.Connection, memory: HistoryCache, episode_id: int, status: str,
                ended: float) -> None:
    if not db.execute(
            "UPDATE episodes SET status = ?, ended_at = ? WHERE id = ? AND status = 'open' "
            "RETURNING id", (status, ended, episode_id)).fetchall():
        refused = missing_or_closed(db, episode_id)
        if not isinstance(refused, EpisodeForgotten):  # the forget closed it: nothing to do
            raise refused


def add_step(db: sqlite3.Connection, memory: HistoryCache, episode_id: int, values: tuple,
             prefix: tuple | None) -> StoredStep:
    """A step (``step_values``) and the prompt prefix it refers to, if new."""
    if prefix is not None:  # undone with the step: no step refers to a missing prefix
        db.execute(INSERT_PREFIX, prefix)
    stored = insert_step(db, values)
    if stored is None:
        raise missing_or_closed(db, episode_id)  # rolls the prefix back too
    memory.appended(stored)
    return stored


def channel_history(db: sqlite3.Connection, memory: HistoryCache, channel_id: str,
                    limit: int, whole: bool = False) -> tuple[str, list]:
    """``("ids", [step ids])`` when memory answers (the bot has those steps: see
    ``core.storage.history.Received``), else ``("steps", [steps])``; ``whole`` asks for
    the steps themselves in any case."""
    found = None if whole else memory.lookup(channel_id, limit)
    if found is not None:
        return "ids", [step.id for step in found]
    return "steps", memory.read(db, channel_id, limit)


def add_event(db: sqlite3.Connection, memory: HistoryCache, values: tuple) -> int:
    """An event; for a forgotten episode, or carrying text of one (a compaction summary
    whose ``sources`` name it), its payload is stored empty."""
    channel_id, episode_id, kind, payload, created = values[:5]
    if episode_id is not None:
        row = db.execute("SELECT forgotten_at FROM episodes WHERE id = ?",
                         (episode_id,)).fetchone()
        if row is None:
            raise ValueError(f"no episode {episode_id}")
        if row["forgotten_at"] is not None and kind not in KEPT_EVENTS:
            payload = "{}"
    if '"sources"' in payload and db.execute(
            "SELECT " + forgotten_sources_sql("json_extract(?, '$.sources')"),
            (payload,)).fetchone()[0]:
        payload = "{}"
    return db.execute(
        "INSERT INTO events (channel_id, episode_id, kind, payload, created_at) "
        "VALUES (?, ?, ?, ?, ?) RETURNING id",
        (channel_id, episode_id, kind, payload, created)).fetchone()["id"]


OPERATIONS: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (start_turn, end_episode, add_step, channel_history, add_event)}
