"""The shape of the store: row dataclasses, their encoding, and migrations.

The row dataclasses live here, next to the SQL that stores them, so that a
column and its field are changed together. The helpers below validate
values on their way in and decode JSON columns on their way out.

``PRAGMA user_version`` holds the number of migrations applied. Migration
``n`` (1-based) takes a database from version ``n - 1`` to ``n`` inside one
``BEGIN IMMEDIATE`` transaction, so a crash mid-migration leaves the old
version intact, and two processes opening the same file (the bot and the
trainer) cannot both apply it: the second re-reads the version under the
write lock and finds the work done.

Migrations are lists of single statements rather than scripts because
``sqlite3``'s ``executescript`` commits any open transaction first, which
would break the one-transaction-per-migration guarantee.

Never edit a migration that has shipped; append a new one.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import aiosqlite

ROLES = ("system", "user", "assistant", "tool")
EPISODE_STATUSES = ("open", "complete", "aborted", "errored")
LABELS = ("accepted", "rejected", "verified")
# The night's own states come from the night runner: judging, training, exporting, gating,
# awaiting_promotion, live. Migration 2 moved this check from SQL into Python.
JOB_STATES = ("queued", "running", "done", "failed", "cancelled", "judging", "training",
              "exporting", "gating", "awaiting_promotion", "live")
RELEASE_STATES = ("candidate", "live", "retired", "rejected")


@dataclass
class Step:
    """One message of a channel, exactly as the model saw or produced it."""

    role: str  # "system" | "user" | "assistant" | "tool"
    content: str = ""
    tool_calls: list[dict] | None = None  # OpenAI-format tool calls of an assistant step
    tool_call_id: str | None = None  # for role="tool"
    name: str | None = None  # tool name for role="tool", or speaker name for user
    model_version: str | None = None  # None: the episode's model_version
    started_at: float = 0.0  # unix seconds
    duration_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    meta: dict | None = None  # free JSON (e.g. image hashes, flags)


@dataclass(kw_only=True)
class StoredStep(Step):
    id: int
    episode_id: int
    channel_id: str
    seq: int  # 0, 1, 2, ... within the episode
    created_at: float


@dataclass
class Episode:
    id: int
    channel_id: str
    started_at: float
    ended_at: float | None
    status: str  # "open" | "complete" | "aborted" | "errored"
    model_version: str | None
    steps: list[StoredStep] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)  # in the order they were given
    # Who gave each label (parallel to labels): a reaction's giver, None for an admin
    # command's; the night caps how many episodes one person's labels decide.
    labellers: list[int | None] = field(default_factory=list)
    release_id: int | None = None  # the live release when it started; None: the base model
    forgotten_at: float | None = None  # set by /forget: excluded, its text erased

    @property
    def label(self) -> str | None:
        """The label that counts: the latest one given (and not taken back)."""
        return self.labels[-1] if self.labels else None


STEP_FIELDS = tuple(f.name for f in fields(Step))
STEP_COLUMNS = ", ".join(STEP_FIELDS)


def check(value: Any, allowed: Iterable[str], what: str) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {', '.join(allowed)}")


def nonempty(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def dumps(value: Any, what: str) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} is not JSON-serialisable: {e}") from None


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


_STORED_FIELDS = (*STEP_FIELDS, "id", "episode_id", "channel_id", "seq", "created_at")


def stored_step(row: sqlite3.Row | dict) -> StoredStep:
    """A step from its row (a ``sqlite3.Row``, or a dict of column -> value)."""
    values = row if isinstance(row, dict) else dict(zip(row.keys(), row))
    values = {name: values[name] for name in _STORED_FIELDS}
    values["tool_calls"] = loads(values["tool_calls"])
    values["meta"] = loads(values["meta"])
    # The values are exactly the fields, so __init__'s 16 keywords are skipped: a turn
    # reads ~20 steps of history back, and this is most of that cost (bench/agent.py).
    step = object.__new__(StoredStep)
    step.__dict__.update(values)
    return step


# The seq is computed inside the INSERT, so concurrent writers (even from two
# processes) can never give one episode a gap or a duplicate.
INSERT_STEP = f"""INSERT INTO steps (episode_id, channel_id, seq, {STEP_COLUMNS}, created_at)
    SELECT e.id, e.channel_id,
           (SELECT COALESCE(MAX(s.seq), -1) + 1 FROM steps s WHERE s.episode_id = e.id),
           ?, ?, ?, ?, ?, COALESCE(?, e.model_version), ?, ?, ?, ?, ?, ?
    FROM episodes e WHERE e.id = ? AND e.status = 'open'
    RETURNING id, episode_id, channel_id, seq, model_version"""


def insert_step(db: sqlite3.Connection, values: tuple) -> StoredStep | None:
    """Insert a step (``step_values``) and return it as stored, or None when its episode
    is missing or no longer open.

    The stored step is made from the values sent, not read back with ``RETURNING *``:
    only what SQLite computed (id, episode, channel, seq, the model) comes back, which
    halves the insert's cost on every step of every turn (bench/agent.py). Its JSON
    fields are decoded from the text stored, as a read decodes them (``stored_step``), so
    it shares no dict with the caller's ``Step`` and equals the step read back."""
    row = db.execute(INSERT_STEP, values).fetchone()
    if row is None:
        return None
    return stored_step({**dict(zip(_VALUE_FIELDS, values)), **dict(zip(_RETURNED, row))})


_VALUE_FIELDS = (*STEP_FIELDS, "created_at", "episode_id")  # step_values' order
_RETURNED = ("id", "episode_id", "channel_id", "seq", "model_version")  # INSERT_STEP's


def check_step(step: Step) -> None:
    check(step.role, ROLES, "role")
    if not isinstance(step.content, str):
        raise ValueError(f"step content must be a string, got {type(step.content).__name__}")


def step_values(step: Step, episode_id: int) -> tuple:
    return (step.role, step.content, dumps(step.tool_calls, "tool_calls"), step.tool_call_id,
            step.name, step.model_version, float(step.started_at), float(step.duration_ms),
            int(step.prompt_tokens), int(step.completion_tokens), dumps(step.meta, "meta"),
            time.time(), episode_id)


def record(row: sqlite3.Row, json_columns: tuple[str, ...]) -> dict:
    values = dict(row)
    for column in json_columns:
        values[column] = loads(values[column])
    return values


def _in(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


MIGRATIONS: list[list[str]] = [
    # 1: the first schema. JSON columns hold text written by json.dumps.
    [
        """CREATE TABLE channels (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL
        )""",
        f"""CREATE TABLE episodes (
            id INTEGER PRIMARY KEY,
            channel_id TEXT NOT NULL REFERENCES channels(id),
            started_at REAL NOT NULL,
            ended_at REAL,
            status TEXT NOT NULL DEFAULT 'open' CHECK (status IN {_in(EPISODE_STATUSES)}),
            model_version TEXT
        )""",
        "CREATE INDEX episodes_started ON episodes(started_at)",
        "CREATE INDEX episodes_ended ON episodes(ended_at)",
        "CREATE INDEX episodes_channel ON episodes(channel_id, started_at)",
        # channel_id is copied from the episode so that channel_history is one
        # index range scan instead of a join over every episode of the channel.
        f"""CREATE TABLE steps (
            id INTEGER PRIMARY KEY,
            episode_id INTEGER NOT NULL REFERENCES episodes(id),
            channel_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL CHECK (role IN {_in(ROLES)}),
            content TEXT NOT NULL DEFAULT '',
            tool_calls TEXT,
            tool_call_id TEXT,
            name TEXT,
            model_version TEXT,
            started_at REAL NOT NULL DEFAULT 0,
            duration_ms REAL NOT NULL DEFAULT 0,
            prompt_tokens INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            meta TEXT,
            created_at REAL NOT NULL,
            UNIQUE (episode_id, seq)
        )""",
        "CREATE INDEX steps_channel ON steps(channel_id, id)",
        f"""CREATE TABLE labels (
            id INTEGER PRIMARY KEY,
            episode_id INTEGER NOT NULL REFERENCES episodes(id),
            label TEXT NOT NULL CHECK (label IN {_in(LABELS)}),
            source TEXT NOT NULL,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX labels_episode ON labels(episode_id)",
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY,
            channel_id TEXT NOT NULL,
            episode_id INTEGER REFERENCES episodes(id),
            kind TEXT NOT NULL,
            payload TEXT NOT NULL,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX events_kind ON events(kind, created_at)",
        "CREATE INDEX events_created ON events(created_at)",
        f"""CREATE TABLE jobs (
            id INTEGER PRIMARY KEY,
            kind TEXT NOT NULL,
            args TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN {_in(JOB_STATES)}),
            progress TEXT NOT NULL DEFAULT '{{}}',
            error TEXT,
            pid INTEGER,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX jobs_kind ON jobs(kind, state)",
        f"""CREATE TABLE releases (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            path TEXT NOT NULL,
            meta TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN {_in(RELEASE_STATES)}),
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        # At most one live release: a promote that forgot to retire the old
        # one fails instead of leaving the server unsure what to serve.
        "CREATE UNIQUE INDEX releases_one_live ON releases(state) WHERE state = 'live'",
    ],
    # 2: the night's ledger, and job states checked in Python (SQLite cannot alter a CHECK).
    [
        """CREATE TABLE jobs_v2 (
            id INTEGER PRIMARY KEY,
            kind TEXT NOT NULL,
            args TEXT NOT NULL,
            state TEXT NOT NULL,
            progress TEXT NOT NULL DEFAULT '{}',
            error TEXT,
            pid INTEGER,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "INSERT INTO jobs_v2 SELECT * FROM jobs",
        "DROP TABLE jobs",
        "ALTER TABLE jobs_v2 RENAME TO jobs",
        "CREATE INDEX jobs_kind ON jobs(kind, state)",
        # One row per judged window, value prediction, understanding score...: what a
        # resumed night must not compute twice. kind + key identify the work item.
        """CREATE TABLE night_records (
            night_id INTEGER NOT NULL,
            kind TEXT NOT NULL,
            key TEXT NOT NULL,
            payload TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (night_id, kind, key)
        )""",
        """CREATE TABLE advantages (
            night_id INTEGER NOT NULL,
            episode_id INTEGER NOT NULL REFERENCES episodes(id),
            step_id INTEGER NOT NULL REFERENCES steps(id),
            advantage REAL NOT NULL,
            parts TEXT NOT NULL,
            PRIMARY KEY (night_id, step_id)
        )""",
    ],
    # 3: each distinct tool list once (core.storage.toolsets); steps refer to it by ref.
    [
        """CREATE TABLE tool_sets (
            ref TEXT PRIMARY KEY,
            schemas TEXT NOT NULL,
            created_at REAL NOT NULL
        )""",
    ],
    # 4: who gave a label (reactions can be taken back, by their giver only), the release
    # that served each episode, and episodes forgotten by /forget.
    [
        "ALTER TABLE labels ADD COLUMN user_id INTEGER",
        "ALTER TABLE episodes ADD COLUMN release_id INTEGER",
        "ALTER TABLE episodes ADD COLUMN forgotten_at REAL",
    ],
    # 5: each distinct prompt prefix once (core.storage.prefixes): what the model was sent
    # before an episode's own messages; assistant steps refer to it by ref.
    [
        """CREATE TABLE prompt_prefixes (
            ref TEXT PRIMARY KEY,
            messages TEXT NOT NULL,
            tools_ref TEXT,
            sources TEXT NOT NULL,
            created_at REAL NOT NULL
        )""",
    ],
]

SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNewError(RuntimeError):
    """The file was written by a newer Nightshift; older code must not touch it."""


async def _user_version(db: aiosqlite.Connection) -> int:
    async with db.execute("PRAGMA user_version") as cur:
        row = await cur.fetchone()
    return int(row[0])


def _too_new(path: str, found: int) -> SchemaTooNewError:
    return SchemaTooNewError(
        f"store {path} has schema version {found}, but this code knows only up to "
        f"{SCHEMA_VERSION}; upgrade Nightshift, or point paths.data_dir at another "
        "directory (never downgrade a store in place)"
    )


async def migrate(db: aiosqlite.Connection, path: str) -> int:
    """Bring the database up to SCHEMA_VERSION; return the version reached.

    ``db`` must be in autocommit mode (isolation_level=None) so that the
    explicit BEGIN/COMMIT here are the only transaction boundaries.
    """
    found = await _user_version(db)
    if found > SCHEMA_VERSION:
        raise _too_new(path, found)
    for target in range(found + 1, SCHEMA_VERSION + 1):
        await db.execute("BEGIN IMMEDIATE")
        try:
            current = await _user_version(db)
            if current > SCHEMA_VERSION:
                raise _too_new(path, current)
            if current < target:
                for statement in MIGRATIONS[target - 1]:
                    await db.execute(statement)
                # user_version lives in the file header and is transactional.
                await db.execute(f"PRAGMA user_version = {target}")
            await db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                await db.execute("ROLLBACK")
            raise
    return await _user_version(db)
