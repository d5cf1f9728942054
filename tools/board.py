"""The swarm board: topics of posts shared by the channels of one swarm.

Small models must talk to each other before they can work as a swarm (seed
lesson 7): each member channel claims sub-tasks and posts results here, and
reads what the others claimed and found. A ``Board`` is one small SQLite file
under ``data_dir`` (posts survive restarts; WAL, one short connection per
call, so the registry's worker threads never share one). Swarms and their
member channels come from the config; a channel outside every swarm can
neither read nor post, and a member only ever sees its own swarm's posts.

A swarm's current task (set by ``/swarm start``) is kept in memory as well as
in the file, so the agent's system prompt can name it without any IO.

The tools run in the registry's thread (sqlite3 blocks).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from tools import ToolContext, ToolError, tool

MAX_TOPIC_CHARS = 80
MAX_POST_CHARS = 4000
READ_LIMIT = 50
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS posts (id INTEGER PRIMARY KEY AUTOINCREMENT, swarm TEXT NOT NULL,"
    " topic TEXT NOT NULL, channel TEXT NOT NULL, text TEXT NOT NULL, created REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS posts_swarm ON posts(swarm, id)",
    "CREATE TABLE IF NOT EXISTS tasks (swarm TEXT PRIMARY KEY, task TEXT NOT NULL,"
    " started REAL NOT NULL)",
)


class NotAMember(ToolError):
    """The channel belongs to no swarm."""


class Board:
    """Every swarm's posts, in one SQLite file."""

    def __init__(self, path: Path, swarms: Mapping[str, Sequence[str]]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.swarms = {name: tuple(channels) for name, channels in swarms.items()}
        self._member_of = {c: name for name, channels in self.swarms.items() for c in channels}
        self._lock = threading.Lock()  # one writer at a time from this process
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            for statement in SCHEMA:
                db.execute(statement)
            self.tasks = dict(db.execute("SELECT swarm, task FROM tasks").fetchall())

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=10)
        try:
            with db:  # commits, or rolls back on an exception
                yield db
        finally:
            db.close()

    def swarm_of(self, channel: str) -> str:
        """The channel's swarm; raises NotAMember (a clear refusal) for any other channel."""
        name = self._member_of.get(channel)
        if name is None:
            raise NotAMember("this channel is not a member of any swarm, so it cannot read or "
                             "post on the swarm board; the swarms and their channels are set "
                             "in the bot's config ([swarms])")
        return name

    def post(self, channel: str, topic: str, text: str) -> int:
        swarm = self.swarm_of(channel)
        with self._lock, self._db() as db:
            cur = db.execute("INSERT INTO posts (swarm, topic, channel, text, created) "
                             "VALUES (?, ?, ?, ?, ?)", (swarm, topic, channel, text, time.time()))
            return int(cur.lastrowid)

    def read(self, channel: str, topic: str = "", since: int = 0,
             limit: int = READ_LIMIT) -> list[dict]:
        """The swarm's posts after id ``since`` (oldest first), of one topic or all."""
        swarm = self.swarm_of(channel)
        sql = "SELECT id, topic, channel, text, created FROM posts WHERE swarm = ? AND id > ?"
        params: tuple = (swarm, since)
        if topic:
            sql += " AND topic = ?"
            params += (topic,)
        with self._db() as db:
            rows = db.execute(sql + " ORDER BY id LIMIT ?", (*params, limit)).fetchall()
        return [dict(zip(("id", "topic", "channel", "text", "created"), r)) for r in rows]

    def start(self, swarm: str, task: str) -> int:
        """Make ``task`` the swarm's current task and post it on the topic ``task``."""
        if swarm not in self.swarms:
            known = ", ".join(self.swarms) or "none are configured"
            raise ValueError(f"there is no swarm {swarm!r}; the swarms are: {known}")
        now = time.time()
        with self._lock, self._db() as db:
            db.execute("INSERT INTO tasks (swarm, task, started) VALUES (?, ?, ?) ON CONFLICT"
                       " (swarm) DO UPDATE SET task = excluded.task, started = excluded.started",
                       (swarm, task, now))
            cur = db.execute("INSERT INTO posts (swarm, topic, channel, text, created) "
                             "VALUES (?, 'task', 'admin', ?, ?)", (swarm, task, now))
        self.tasks[swarm] = task
        return int(cur.lastrowid)

    def stop(self, swarm: str) -> bool:
        with self._lock, self._db() as db:
            db.execute("DELETE FROM tasks WHERE swarm = ?", (swarm,))
        return self.tasks.pop(swarm, None) is not None

    def prompt_section(self, channel: str) -> str:
        """The system-prompt section of a member whose swarm has a task; "" otherwise."""
        swarm = self._member_of.get(channel)
        task = self.tasks.get(swarm or "")
        if not task:
            return ""
        others = ", ".join(c for c in self.swarms[swarm] if c != channel)
        return (f"You work in the swarm {swarm!r} with the channels {others}. Its task:\n{task}\n"
                "Before you work on anything, call board_read to see what the others claimed, "
                "then claim one unclaimed sub-task with board_post(topic='claims', text=...). "
                "Work only on your claim. When done, post your result with "
                "board_post(topic='results', text=...). Read the board again before you claim "
                "the next sub-task.")


def _board(ctx: ToolContext) -> Board:
    board = ctx.services.board
    if board is None:
        raise NotAMember("there is no swarm board in this bot (no swarms are configured)")
    return board


@tool
def board_post(ctx: ToolContext, topic: str, text: str) -> str:
    """Post on your swarm's board, which every channel of the swarm reads: claim a sub-task
    (topic 'claims') before working on it, and post what you found (topic 'results').

    Args:
        topic: A short topic name, e.g. claims, results or questions.
        text: What to tell the other channels, up to 4000 characters.
    """
    topic, text = topic.strip(), text.strip()
    if not topic or len(topic) > MAX_TOPIC_CHARS:
        raise ToolError(f"topic must be 1 to {MAX_TOPIC_CHARS} characters, e.g. claims")
    if not text:
        raise ToolError("text is empty; say what you claim or found")
    if len(text) > MAX_POST_CHARS:
        raise ToolError(f"text has {len(text)} characters; the limit is {MAX_POST_CHARS}. "
                        "Post a summary, and keep the details in a file")
    post_id = _board(ctx).post(ctx.channel, topic, text)
    return f"posted #{post_id} on {topic!r}"


@tool
def board_read(ctx: ToolContext, topic: str = "", since: int = 0) -> str:
    """Read your swarm's board: the posts of one topic (or all topics) newer than a post id.

    Args:
        topic: Only this topic, e.g. claims; empty for every topic.
        since: Only posts after this post id; 0 for all. Pass the last id you saw to get news.
    """
    if since < 0:
        raise ToolError("since must be 0 or a post id")
    posts = _board(ctx).read(ctx.channel, topic.strip(), since)
    if not posts:
        return f"no posts{' on ' + repr(topic) if topic else ''} after #{since}"
    lines = [f"#{p['id']} [{p['topic']}] {p['channel']} "
             f"({time.strftime('%H:%M', time.localtime(p['created']))}): {p['text']}"
             for p in posts]
    more = ("" if len(posts) < READ_LIMIT else
            f"\n(more posts follow; read again with since={posts[-1]['id']})")
    return "\n".join(lines) + more + f"\n(last id {posts[-1]['id']}; pass since={posts[-1]['id']} " \
        "next time for news only)"
