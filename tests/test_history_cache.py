"""The channels' recent steps kept in memory (core.storage.history): every read equals
what SQLite says, whoever wrote, forgot or rolled back in between."""

from __future__ import annotations

import asyncio
import random
import sqlite3

import pytest

from core.storage.group_commit import Batcher
from core.storage.history import HistoryCache, read_history
from core.storage.received import Received
from core.storage.schema import step_values
from core.storage.store import Step, Store
from core.storage.writer import bound


@pytest.fixture
async def store(tmp_path):
    s = await Store.open(tmp_path / "store.db")
    yield s
    await s.close()


def from_sql(path, channel: str, limit: int) -> list[tuple]:
    with sqlite3.connect(path) as db:
        db.row_factory = sqlite3.Row
        return [(s.id, s.content) for s in read_history(db, channel, limit)]


def seen(steps) -> list[tuple]:
    return [(s.id, s.content) for s in steps]


@pytest.mark.parametrize("bot_keeps", [None, 3])
async def test_reads_equal_sqlite_through_turns_ends_and_failed_steps(store, tmp_path, bot_keeps):
    if bot_keeps is not None:  # the bot lets most steps go: reads by ids fall back to steps
        store._received = Received(keep=bot_keeps)
    rng = random.Random(7)
    path = tmp_path / "store.db"
    open_episodes: dict[str, int] = {}
    for i in range(300):
        channel = f"ch{rng.randrange(4)}"
        action = rng.random()
        if channel not in open_episodes or action < 0.2:
            if channel in open_episodes:
                await store.end_episode(open_episodes[channel], "complete")
            open_episodes[channel], _ = await store.start_turn(
                channel, None, [Step(role="system", content="sys"),
                                Step(role="user", content=f"u{i}")])
        elif action < 0.3:  # a step for an ended episode is refused and must not be kept
            ended, _ = await store.start_turn(channel, None, [Step(role="user", content="x")])
            await store.end_episode(ended, "complete")
            with pytest.raises(ValueError):
                await store.add_step(ended, Step(role="assistant", content=f"refused{i}"))
        else:
            await store.add_step(open_episodes[channel], Step(role="assistant", content=f"a{i}"))
        limit = rng.choice((0, 1, 5, 20, 64, 100))
        assert seen(await store.channel_history(channel, limit)) == from_sql(path, channel, limit)
    if bot_keeps is None:
        assert store._received.hits > 200  # most reads were answered from memory, by ids
    else:
        assert store._received.misses > 100  # ...and asked again, whole, when not kept


async def test_a_forgotten_episode_leaves_the_history_at_once(store):
    first, _ = await store.start_turn("dev", None, [Step(role="user", content="secret")])
    await store.end_episode(first, "complete")
    second, _ = await store.start_turn("dev", None, [Step(role="user", content="kept")])
    assert [s.content for s in await store.channel_history("dev", 20)] == ["secret", "kept"]
    await store.forget_episode(first)  # on the store's other connection
    assert [s.content for s in await store.channel_history("dev", 20)] == ["kept"]
    kept = [step.content for steps in store._received._by_channel.values()
            for step in steps.values()]
    assert "secret" not in kept  # the bot's copies of the erased text are gone too


async def test_another_process_step_is_seen(store, tmp_path):
    episode, _ = await store.start_turn("dev", None, [Step(role="user", content="mine")])
    assert len(await store.channel_history("dev", 20)) == 1
    async with await Store.open(tmp_path / "store.db") as other:  # its own connections
        await other.add_step(episode, Step(role="assistant", content="theirs"))
    assert [s.content for s in await store.channel_history("dev", 20)] == ["mine", "theirs"]


class Writer:
    """The writer process's parts (core.storage.writer), run in this process, so that a
    test can reach its connection."""

    def __init__(self, path) -> None:
        self.memory = HistoryCache()
        self.batcher = Batcher(str(path), 1000, on_begin=self.memory.sync,
                               on_rollback=self.memory.clear)

    def __call__(self, name: str, *args):
        [(ok, value)] = self.batcher.commit([bound(name, args, self.memory)])
        if not ok:
            raise value
        return value

    def history(self, channel: str) -> list[str]:
        kind, found = self("channel_history", channel, 20, True)
        return [s.content for s in found]


async def test_a_batch_that_fails_to_commit_leaves_nothing_in_memory(store, tmp_path):
    path = tmp_path / "store.db"
    writer = Writer(path)
    try:
        episode, _ = writer("start_turn", "d", "", 0.0, None, None,
                            [step_values(Step(role="user", content="hi"), None)])
        assert writer.history("d") == ["hi"]
        real = writer.batcher.conn

        class FailingCommit:
            # The step is inserted (and kept in memory), then the batch's COMMIT fails, as
            # it would on a full disk: the batch is rolled back whole.
            def __getattr__(self, name):
                return getattr(real, name)

            def execute(self, sql, *args):
                if sql == "COMMIT":
                    raise sqlite3.OperationalError("disk I/O error (planted)")
                return real.execute(sql, *args)

        writer.batcher.conn = FailingCommit()
        with pytest.raises(sqlite3.OperationalError, match="planted"):
            writer("add_step", episode,
                   step_values(Step(role="assistant", content="lost"), episode), None)
        writer.batcher.conn = real
        assert writer.history("d") == ["hi"]
        assert from_sql(path, "d", 20) == [(1, "hi")]
    finally:
        writer.batcher.close()


async def test_concurrent_turns_read_their_own_channels(store, tmp_path):
    async def turn(channel: str, n: int) -> None:
        episode, _ = await store.start_turn(channel, None, [Step(role="user", content=f"q{n}")])
        await store.add_step(episode, Step(role="assistant", content=f"a{n}"))
        await store.end_episode(episode, "complete")

    for n in range(5):
        await asyncio.gather(*(turn(f"c{i}", n) for i in range(10)))
        for i in range(10):
            history = await store.channel_history(f"c{i}", 4)
            assert seen(history) == from_sql(tmp_path / "store.db", f"c{i}", 4)
            assert {s.channel_id for s in history} == {f"c{i}"}


async def test_a_step_as_stored_is_the_step_read_back(tmp_path):
    # The store builds a stored step from the values it inserted, not from RETURNING *:
    # it must equal, field for field, the step SQLite gives back, and share no dict with
    # the caller's Step.
    path = tmp_path / "store.db"
    store = await Store.open(path)
    try:
        meta = {"context": {"ref": "abc", "start": 2}, "ok": True, "big": 2**70 + 1}
        call = [{"id": "c1", "type": "function",
                 "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}]
        episode, opened = await store.start_turn("s", "alias", [
            Step(role="system", content="sys", meta={"tools_ref": None}),
            Step(role="user", content="hi ☃", name="ann")])
        step = Step(role="assistant", content="", tool_calls=call, meta=meta,
                    duration_ms=12.5, prompt_tokens=7, completion_tokens=3)
        stored = await store.add_step(episode, step)
        meta["context"]["ref"] = "changed"
        with sqlite3.connect(path) as db:
            db.row_factory = sqlite3.Row
            back = read_history(db, "s", 10)
        assert [vars(s) for s in [*opened, stored]] == [vars(s) for s in back]
        assert stored.meta["context"]["ref"] == "abc" and stored.seq == 2
        assert stored.model_version == "alias"  # taken from the episode, as SQLite set it
    finally:
        await store.close()


def channel_name(path, channel: str) -> str | None:
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT name FROM channels WHERE id = ?", (channel,)).fetchone()
    return None if row is None else row[0]


async def test_a_turn_skips_the_channel_upsert_only_while_it_would_change_nothing(store, tmp_path):
    path = tmp_path / "store.db"
    writer = Writer(path)
    statements: list[str] = []
    writer.batcher.conn.set_trace_callback(statements.append)

    def turn(name: str, text: str) -> None:
        writer("start_turn", "c1", name, 0.0, None, None,
               [step_values(Step(role="user", content=text), None)])

    try:
        turn("general", "a")
        assert any("INSERT INTO channels" in s for s in statements)
        statements.clear()
        turn("general", "b")
        assert not any("INSERT INTO channels" in s for s in statements)  # known: skipped
        turn("renamed", "c")
        assert any("INSERT INTO channels" in s for s in statements)  # a new name is written
        assert channel_name(path, "c1") == "renamed"
        # Another connection renames it back: the next turn's name is written again, as
        # the upsert always did, because the batch saw that another connection committed.
        await store.ensure_channel("c1", "general")
        turn("renamed", "d")
        assert channel_name(path, "c1") == "renamed"
    finally:
        writer.batcher.close()


async def test_an_upsert_rolled_back_with_its_turn_is_not_remembered(store, tmp_path):
    path = tmp_path / "store.db"
    writer = Writer(path)
    good = step_values(Step(role="user", content="ok"), None)
    bad = ("narrator", *good[1:])  # refused by the steps table's CHECK, after the upsert
    try:
        with pytest.raises(sqlite3.IntegrityError):
            writer("start_turn", "new", "n", 0.0, None, None, [good, bad])
        assert channel_name(path, "new") is None  # the whole turn was undone, the upsert too
        # So the next turn must write the channel again, or its episode has no channel row.
        episode, _ = writer("start_turn", "new", "n", 0.0, None, None, [good])
        assert channel_name(path, "new") == "n"
        assert writer.history("new") == ["ok"]
    finally:
        writer.batcher.close()


async def test_a_step_that_cannot_be_stored_is_refused_before_it_is_sent(store, tmp_path):
    bad = Step(role="user", content="x")
    bad.meta = {"unserialisable": object()}
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        await store.start_turn("new", None, [Step(role="user", content="ok"), bad], name="n")
    assert channel_name(tmp_path / "store.db", "new") is None
    episode, _ = await store.start_turn("new", None, [Step(role="user", content="hi")], name="n")
    assert [s.content for s in await store.channel_history("new", 20)] == ["hi"]
