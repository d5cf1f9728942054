"""Group commit: many channels' steps in one transaction, each acknowledged only once
committed; one failing operation does not take the others with it."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import threading
import time

import pytest

from core.storage.group_commit import MAX_BATCH, Batcher, GroupCommit, frame
from core.storage.history import HistoryCache
from core.storage.schema import step_values
import core.storage.store as store_module
from core.storage.store import Prefix, Step, Store
from core.storage.writer import Requests, bound


@pytest.fixture
async def store(tmp_path):
    s = await Store.open(tmp_path / "store.db")
    yield s
    await s.close()


async def make_schema(path) -> None:
    store = await Store.open(path)
    await store.close()


def count_steps(path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT COUNT(*) FROM steps").fetchone()[0]


async def test_concurrent_channels_steps_share_transactions_and_all_are_stored(store, tmp_path):
    episodes = [(await store.start_turn(f"ch{i}", None, [Step(role="user", content="hi")]))[0]
                for i in range(20)]
    before = store._commits.batches
    stored = await asyncio.gather(*(store.add_step(e, Step(role="assistant", content=f"a{e}"))
                                    for e in episodes))
    assert [s.content for s in stored] == [f"a{e}" for e in episodes]
    assert all(s.seq == 1 for s in stored)
    # 20 steps queued in the same loop iteration: far fewer transactions than steps
    assert store._commits.batches - before < 20
    assert count_steps(tmp_path / "store.db") == 40  # committed: another connection sees them


async def test_a_failing_operation_is_rolled_back_alone(store, tmp_path):
    open_ep, _ = await store.start_turn("a", None, [Step(role="user", content="hi")])
    ended, _ = await store.start_turn("b", None, [Step(role="user", content="hi")])
    await store.end_episode(ended, "complete")
    results = await asyncio.gather(
        store.add_step(open_ep, Step(role="assistant", content="kept")),
        store.add_step(ended, Step(role="assistant", content="refused")),
        store.add_event("a", open_ep, "note", {"x": 1}),
        return_exceptions=True)
    assert results[0].content == "kept"
    assert isinstance(results[1], ValueError) and "already complete" in str(results[1])
    assert isinstance(results[2], int)
    with sqlite3.connect(tmp_path / "store.db") as db:
        contents = [r[0] for r in db.execute("SELECT content FROM steps ORDER BY id")]
    assert contents == ["hi", "hi", "kept"]


def test_a_batch_with_a_failing_operation_is_run_again_without_it(tmp_path):
    # The batch runs first without a savepoint per operation; one that writes and then
    # raises rolls the whole transaction back and the batch runs again, each operation
    # apart. Its half-write is gone, the others are stored once, in memory as in SQLite.
    # (The writer process's parts, run here, so that a planted operation can be given.)
    path = tmp_path / "store.db"
    asyncio.run(make_schema(path))
    memory = HistoryCache()
    batcher = Batcher(str(path), 1000, on_begin=memory.sync, on_rollback=memory.clear)
    try:
        [(ok, (episode, _))] = batcher.commit([bound("start_turn", (
            "e", "", 0.0, None, None, [step_values(Step(role="user", content="one"), None)]),
            memory)])
        batcher.commit([bound("channel_history", ("e", 10), memory)])  # kept in memory now

        def half_then_fail(db):
            db.execute("INSERT INTO channels (id, created_at) VALUES ('half', 0)")
            raise ValueError("planted")

        results = batcher.commit([
            bound("add_step", (episode, step_values(Step(role="assistant", content="two"),
                                                    episode), None), memory),
            half_then_fail,
            bound("channel_history", ("e", 10, True), memory),
            bound("add_step", (episode, step_values(Step(role="user", content="three"),
                                                    episode), None), memory)])
        assert [ok for ok, _ in results] == [True, False, True, True]
        assert isinstance(results[1][1], ValueError)
        assert [s.content for s in results[2][1][1]] == ["one", "two"]
        [(ok, (kind, history))] = batcher.commit([bound("channel_history", ("e", 10, True),
                                                        memory)])
        assert [s.content for s in history] == ["one", "two", "three"]
    finally:
        batcher.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM channels WHERE id = 'half'").fetchone()[0] == 0
        assert [r[0] for r in db.execute("SELECT content FROM steps ORDER BY id")] == [
            "one", "two", "three"]


async def test_a_store_operation_that_fails_half_way_is_undone_alone(store, tmp_path):
    # Through the writer process: a step with a new prompt prefix, for an episode that has
    # ended, writes the prefix and then raises; the batch it shares is run again apart.
    episode, _ = await store.start_turn("e", None, [Step(role="user", content="one")])
    ended, _ = await store.start_turn("f", None, [Step(role="user", content="x")])
    await store.end_episode(ended, "complete")
    prefix = Prefix([{"role": "system", "content": "never stored"}])
    before = store._commits.batches
    results = await asyncio.gather(
        store.add_step(episode, Step(role="assistant", content="two")),
        store.add_step(ended, Step(role="assistant", content="refused"), prefix=prefix),
        store.channel_history("e", 10),
        store.add_step(episode, Step(role="user", content="three")),
        return_exceptions=True)
    assert store._commits.batches - before == 1  # one batch, run twice inside
    assert isinstance(results[1], ValueError) and "already complete" in str(results[1])
    assert [s.content for s in results[2]] == ["one", "two"]
    assert [s.content for s in await store.channel_history("e", 10)] == ["one", "two", "three"]
    with sqlite3.connect(tmp_path / "store.db") as db:
        assert db.execute("SELECT COUNT(*) FROM prompt_prefixes").fetchone()[0] == 0


async def test_a_read_sees_the_writes_queued_before_it(store):
    episode, _ = await store.start_turn("c", None, [Step(role="user", content="one")])
    write = asyncio.ensure_future(store.add_step(episode, Step(role="assistant", content="two")))
    await asyncio.sleep(0)  # the write is queued (not yet committed) when the read is asked
    history = await store.channel_history("c", 10)
    await write
    assert [s.content for s in history] == ["one", "two"]


async def test_nothing_is_acknowledged_when_the_commit_fails(tmp_path, monkeypatch):
    path = tmp_path / "store.db"
    monkeypatch.setattr(store_module, "_BUSY_TIMEOUT_MS", 50)  # the writer's, as it starts
    store = await Store.open(path)
    try:
        episode, _ = await store.start_turn("d", None, [Step(role="user", content="hi")])
        # Another connection holds the write lock past the busy timeout: BEGIN fails, so
        # every operation of the batch hears it and none is stored.
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            results = await asyncio.gather(
                store.add_step(episode, Step(role="assistant", content="x")),
                store.add_step(episode, Step(role="assistant", content="y")),
                return_exceptions=True)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert all(isinstance(r, sqlite3.OperationalError) for r in results)
        assert "locked" in str(results[0])
        assert count_steps(path) == 1
        # and the queue keeps working once the lock is free
        assert (await store.add_step(episode, Step(role="assistant", content="z"))).seq == 1
    finally:
        await store.close()


async def test_close_commits_what_is_queued_then_refuses(tmp_path):
    store = await Store.open(tmp_path / "store.db")
    episode, _ = await store.start_turn("e", None, [Step(role="user", content="hi")])
    pending = [asyncio.ensure_future(store.add_step(episode, Step(role="tool", content=str(i))))
               for i in range(5)]
    await asyncio.sleep(0)
    await store.close()
    assert [p.result().seq for p in pending] == [1, 2, 3, 4, 5]
    assert count_steps(tmp_path / "store.db") == 6
    with pytest.raises(RuntimeError, match="closed"):
        await store.add_step(episode, Step(role="tool", content="late"))


async def test_a_dead_writer_fails_its_waiting_callers_and_the_next_one_starts_a_new_one(
        tmp_path):
    store = await Store.open(tmp_path / "store.db")
    try:
        episode, _ = await store.start_turn("w", None, [Step(role="user", content="hi")])
        old_pid = store._commits._proc.pid
        os.kill(old_pid, signal.SIGSTOP)  # it cannot answer what is sent now
        waiting = asyncio.ensure_future(
            store.add_step(episode, Step(role="assistant", content="never")))
        await asyncio.sleep(0.1)
        store._commits._proc.kill()
        with pytest.raises(RuntimeError, match="writer process stopped"):
            await asyncio.wait_for(waiting, 10)
        stored = await asyncio.wait_for(
            store.add_step(episode, Step(role="assistant", content="after")), 10)
        assert store._commits._proc.pid != old_pid and store._commits.restarts == 1
        assert stored.content == "after"
        assert [s.content for s in await store.channel_history("w", 10)][-1] == "after"
    finally:
        await asyncio.wait_for(store.close(), 10)
    with sqlite3.connect(tmp_path / "store.db") as db:
        contents = [r[0] for r in db.execute("SELECT content FROM steps ORDER BY id")]
    assert contents == ["hi", "after"]


async def test_a_ctrl_c_for_the_console_does_not_stop_the_writer(store):
    episode, _ = await store.start_turn("w", None, [Step(role="user", content="hi")])
    # A terminal's Ctrl-C goes to its foreground group: the writer is in a session of its own,
    assert os.getsid(store._commits._proc.pid) != os.getsid(0)
    os.kill(store._commits._proc.pid, signal.SIGINT)  # and ignores one sent to it anyway
    await asyncio.sleep(0.2)
    stored = await asyncio.wait_for(
        store.add_step(episode, Step(role="assistant", content="still here")), 10)
    assert stored.seq == 1 and store._commits.restarts == 0  # the same writer answered


async def test_arguments_that_cannot_be_sent_are_refused_before_anything_is_queued(store):
    with pytest.raises(ValueError, match="cannot be sent"):
        await store._commits.run("add_event", (lambda: None,))
    assert not store._commits._waiting
    assert await asyncio.wait_for(store.add_event("w", None, "note", {"still": "works"}), 10) > 0


async def test_a_caller_cancelled_mid_batch_leaves_the_others_their_own_answers(store):
    episodes = [(await store.start_turn(f"k{i}", None, [Step(role="user", content="q")]))[0]
                for i in range(3)]
    calls = [asyncio.ensure_future(store.add_step(e, Step(role="assistant", content=f"a{e}")))
             for e in episodes]
    await asyncio.sleep(0)  # all three sent
    calls[1].cancel()
    first, last = await calls[0], await calls[2]
    assert (first.episode_id, first.content) == (episodes[0], f"a{episodes[0]}")
    assert (last.episode_id, last.content) == (episodes[2], f"a{episodes[2]}")
    assert calls[1].cancelled()


async def test_close_during_a_restart_waits_for_it_and_leaves_no_writer(tmp_path):
    store = await Store.open(tmp_path / "store.db")
    episode, _ = await store.start_turn("r", None, [Step(role="user", content="hi")])
    store._commits._proc.kill()
    await store._commits._proc.wait()
    await asyncio.sleep(0.1)  # the answers' reader has seen the end
    call = asyncio.ensure_future(store.add_step(episode, Step(role="assistant", content="x")))
    await asyncio.sleep(0)  # it is starting a new writer
    await asyncio.wait_for(store.close(), 30)
    outcome = (await asyncio.gather(call, return_exceptions=True))[0]
    # Either it got in before the close (stored) or it was told the store closed: never a hang.
    assert getattr(outcome, "content", None) == "x" or "closed" in str(outcome)
    assert store._commits._proc.returncode is not None  # the new writer was closed too


def test_an_in_memory_store_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="must be a file"):
        GroupCommit(":memory:", 1000)
    with pytest.raises(ValueError, match="must be a file"):
        asyncio.run(Store.open(":memory:"))


def frames_in(*requests) -> bytes:
    return b"".join(frame(r) for r in requests)


def test_the_writer_reads_frames_split_across_reads_and_batches_what_is_waiting():
    read_end, write_end = os.pipe()
    requests = Requests(read_end)
    data = frames_in(*[("channel_history", ("c", i)) for i in range(MAX_BATCH + 5)])
    writer = threading.Thread(target=lambda: [os.write(write_end, data[:7]), time.sleep(0.2),
                                              os.write(write_end, data[7:]), os.close(write_end)])
    writer.start()
    first = requests.batch()  # waits for the first whole frame, then takes what is ready
    rest = []
    while (batch := requests.batch()) is not None:
        rest += batch
    writer.join()
    os.close(read_end)
    got = first + rest
    assert len(first) <= MAX_BATCH
    assert [args[1] for _, args in got] == list(range(MAX_BATCH + 5))


def test_the_writer_ignores_a_cut_frame_at_the_end_and_answers_an_unreadable_one_in_place():
    read_end, write_end = os.pipe()
    good = frame(("channel_history", ("c", 1)))
    unreadable = frame(("x",))[:4] + b"\x80\x05not a pickle"
    unreadable = len(unreadable[4:]).to_bytes(4, "big") + unreadable[4:]
    os.write(write_end, good + unreadable + good + good[:5])
    os.close(write_end)
    requests = Requests(read_end)
    batch = requests.batch()
    assert requests.batch() is None  # the cut frame is no request
    os.close(read_end)
    assert [name for name, _ in batch] == ["channel_history", "", "channel_history"]
    with pytest.raises(ValueError, match="could not read a request"):
        bound(*batch[1], HistoryCache())(None)
