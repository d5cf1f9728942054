"""The trajectory store: what goes in comes out, and survives a SIGKILL."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import core.storage.schema
from core.storage.schema import SCHEMA_VERSION
from core.storage.store import SchemaTooNewError, Step, Store


def _load_writer():
    # By path, so this works whether or not tests/ is a package.
    if "store_writer" in sys.modules:
        return sys.modules["store_writer"]
    path = Path(__file__).with_name("store_writer.py")
    spec = importlib.util.spec_from_file_location("store_writer", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["store_writer"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
async def store(tmp_path):
    async with await Store.open(tmp_path / "store.db") as s:
        yield s


TOOL_CALLS = [
    {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "notes/a.md"}'},
    }
]


async def test_steps_round_trip_with_tool_calls_meta_and_timings(store):
    ep = await store.start_episode("general", model_version="base-q8")
    steps = [
        Step(role="system", content="You are Nightshift."),
        Step(role="user", content="read a.md ✓", name="ana", meta={"images": ["sha256:ab"]}),
        Step(
            role="assistant",
            tool_calls=TOOL_CALLS,
            model_version="night-3",
            started_at=1700000000.5,
            duration_ms=812.25,
            prompt_tokens=120,
            completion_tokens=17,
        ),
        Step(role="tool", content="# A\n", tool_call_id="call_1", name="read_file"),
    ]
    returned = [await store.add_step(ep, s) for s in steps]
    [episode] = await store.episodes_since(0)
    assert episode.steps == returned
    for given, stored in zip(steps, episode.steps):
        for field in ("role", "content", "tool_calls", "tool_call_id", "name", "meta"):
            assert getattr(stored, field) == getattr(given, field)
    assistant = episode.steps[2]
    assert (assistant.started_at, assistant.duration_ms) == (1700000000.5, 812.25)
    assert (assistant.prompt_tokens, assistant.completion_tokens) == (120, 17)
    assert all(s.episode_id == ep and s.channel_id == "general" for s in episode.steps)


async def test_step_without_model_version_takes_the_episodes(store):
    ep = await store.start_episode("general", model_version="base-q8")
    plain = await store.add_step(ep, Step(role="assistant", content="hi"))
    tagged = await store.add_step(ep, Step(role="assistant", content="hi", model_version="n2"))
    assert (plain.model_version, tagged.model_version) == ("base-q8", "n2")


async def test_seq_counts_from_zero_in_each_episode(store):
    a = await store.start_episode("a")
    b = await store.start_episode("b")
    seqs = [
        (await store.add_step(ep, Step(role="user", content=str(i)))).seq
        for i, ep in enumerate([a, a, b, a, b])
    ]
    assert seqs == [0, 1, 0, 2, 1]


async def test_concurrent_writers_to_one_episode_get_distinct_contiguous_seqs(store):
    ep = await store.start_episode("busy")
    stored = await asyncio.gather(
        *(store.add_step(ep, Step(role="user", content=str(i))) for i in range(60))
    )
    assert sorted(s.seq for s in stored) == list(range(60))


async def test_channel_history_is_the_last_steps_across_episodes_oldest_first(store):
    first = await store.start_episode("dev")
    for i in range(3):
        await store.add_step(first, Step(role="user", content=f"old {i}"))
    await store.end_episode(first, "complete")
    other = await store.start_episode("random")
    await store.add_step(other, Step(role="user", content="elsewhere"))
    second = await store.start_episode("dev")
    for i in range(2):
        await store.add_step(second, Step(role="user", content=f"new {i}"))

    history = await store.channel_history("dev", limit=4)
    assert [s.content for s in history] == ["old 1", "old 2", "new 0", "new 1"]
    assert [s.content for s in await store.channel_history("dev", 100)][0] == "old 0"
    assert await store.channel_history("dev", 0) == []
    assert await store.channel_history("nowhere", 5) == []


async def test_episodes_since_filters_by_time_and_channel_and_carries_labels(store):
    old = await store.start_episode("dev")
    await store.add_step(old, Step(role="user", content="yesterday"))
    await store.end_episode(old, "complete")
    straddling = await store.start_episode("dev")
    await asyncio.sleep(0.01)
    cutoff = time.time()
    await asyncio.sleep(0.01)
    await store.end_episode(straddling, "aborted")
    today = await store.start_episode("dev", model_version="night-1")
    await store.add_step(today, Step(role="user", content="today"))
    await store.add_label(today, "accepted", "reaction:ana")
    await store.add_label(today, "verified", "verifier:pytest")
    elsewhere = await store.start_episode("random")

    all_recent = await store.episodes_since(cutoff)
    assert [e.id for e in all_recent] == [straddling, today, elsewhere]
    dev = await store.episodes_since(cutoff, channel_id="dev")
    assert [e.id for e in dev] == [straddling, today]
    assert dev[0].status == "aborted" and dev[0].ended_at >= cutoff
    assert dev[1].labels == ["accepted", "verified"]
    assert [s.content for s in dev[1].steps] == ["today"]
    # Counted by SQLite, as the schedule counts them, the same episodes.
    assert await store.count_episodes_since(cutoff) == 3
    assert await store.count_episodes_since(0) == 4
    assert await store.episode_status(straddling) == "aborted"
    assert await store.episode_status(elsewhere) == "open"
    assert await store.episode_status(10_000) is None
    assert dev[1].status == "open" and dev[1].ended_at is None
    assert dev[1].model_version == "night-1"
    assert len(await store.episodes_since(0)) == 4


async def test_ended_episode_refuses_more_steps_and_a_second_end(store):
    ep = await store.start_episode("dev")
    await store.end_episode(ep, "errored")
    with pytest.raises(ValueError, match="already errored"):
        await store.add_step(ep, Step(role="user", content="late"))
    with pytest.raises(ValueError, match="already errored"):
        await store.end_episode(ep, "complete")


async def test_jobs_move_through_states_with_progress(store):
    job_id = await store.create_job("sleep", {"night": 3})
    job = await store.job(job_id)
    assert job["state"] == "queued" and job["args"] == {"night": 3} and job["progress"] == {}
    await store.update_job(job_id, state="running", pid=4242, progress={"stage": "judge"})
    await store.update_job(job_id, progress={"stage": "train", "step": 10})
    job = await store.job(job_id)
    assert (job["state"], job["pid"], job["progress"]) == (
        "running",
        4242,
        {"stage": "train", "step": 10},
    )
    await store.update_job(job_id, state="failed", error="CUDA out of memory")
    other = await store.create_job("export", {})
    assert [j["id"] for j in await store.jobs(kind="sleep")] == [job_id]
    assert [j["id"] for j in await store.jobs(states=["queued"])] == [other]
    assert [j["id"] for j in await store.jobs(states=["failed", "queued"])] == [job_id, other]
    assert (await store.job(job_id))["error"] == "CUDA out of memory"
    assert await store.job(999) is None


async def test_release_going_live_retires_the_previous_live_one(store):
    one = await store.add_release("night-1", "/data/releases/night-1", {"sha256": "aa"})
    two = await store.add_release("night-2", "/data/releases/night-2", {"sha256": "bb"})
    assert [r["state"] for r in await store.releases()] == ["candidate", "candidate"]
    await store.set_release_state(one, "live")
    await store.set_release_state(two, "live")
    states = {r["name"]: r["state"] for r in await store.releases()}
    assert states == {"night-1": "retired", "night-2": "live"}
    await store.set_release_state(one, "live")  # rollback
    states = {r["name"]: r["state"] for r in await store.releases()}
    assert states == {"night-1": "live", "night-2": "retired"}
    await store.set_release_state(two, "rejected")
    assert (await store.releases())[1]["meta"] == {"sha256": "bb"}


async def test_events_filter_by_kind_and_time(store):
    ep = await store.start_episode("dev")
    stray = await store.add_event("dev", ep, "stray_end_of_turn", {"step_seq": 4, "answer": "no"})
    await asyncio.sleep(0.01)
    cutoff = time.time()
    later = await store.add_event("dev", None, "swap", {"release": "night-2"})
    assert [e["id"] for e in await store.events()] == [stray, later]
    [event] = await store.events(kind="stray_end_of_turn")
    assert event["payload"] == {"step_seq": 4, "answer": "no"} and event["episode_id"] == ep
    assert [e["id"] for e in await store.events(since=cutoff)] == [later]


async def test_empty_file_is_migrated_to_the_current_schema_in_wal_mode(tmp_path):
    path = tmp_path / "deep" / "er" / "store.db"
    async with await Store.open(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert await store.integrity_check() == "ok"
    db = sqlite3.connect(path)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"channels", "episodes", "steps", "labels", "events", "jobs", "releases"} <= tables
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


async def test_reopening_keeps_data_and_does_not_migrate_again(tmp_path):
    path = tmp_path / "store.db"
    async with await Store.open(path) as store:
        ep = await store.start_episode("dev")
        await store.add_step(ep, Step(role="user", content="kept"))
    async with await Store.open(path) as store:
        assert [s.content for s in await store.channel_history("dev", 5)] == ["kept"]
        assert store.schema_version == SCHEMA_VERSION


async def test_store_newer_than_the_code_is_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "store.db"
    async with await Store.open(path):
        pass
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    db.close()
    with pytest.raises(SchemaTooNewError, match=f"version {SCHEMA_VERSION + 5}.*upgrade"):
        await Store.open(path)


async def test_failing_migration_rolls_back_to_the_previous_version(tmp_path, monkeypatch):
    path = tmp_path / "store.db"
    async with await Store.open(path):
        pass
    broken = ["CREATE TABLE half_done (x)", "CREATE TABLE steps (x)"]  # second one fails
    monkeypatch.setattr(core.storage.schema, "MIGRATIONS", [*core.storage.schema.MIGRATIONS, broken])
    monkeypatch.setattr(core.storage.schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(sqlite3.OperationalError, match="already exists"):
        await Store.open(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'half_done'").fetchall() == []
    db.close()


BAD_INPUTS = [
    (lambda s, ep: s.add_step(ep, Step(role="robot")), "unknown role 'robot'"),
    (lambda s, ep: s.add_step(ep + 99, Step(role="user")), "no episode"),
    (lambda s, ep: s.add_step(ep, Step(role="user", content=None)), "content must be"),
    (lambda s, ep: s.add_step(ep, Step(role="user", meta={"x": object()})), "meta is not"),
    (lambda s, ep: s.end_episode(ep, "open"), "unknown episode status 'open'"),
    (lambda s, ep: s.end_episode(ep, "done"), "unknown episode status"),
    (lambda s, ep: s.end_episode(ep + 99, "complete"), "no episode"),
    (lambda s, ep: s.add_label(ep, "great", "admin"), "unknown label 'great'"),
    (lambda s, ep: s.add_label(ep + 99, "accepted", "admin"), "no episode"),
    (lambda s, ep: s.add_label(ep, "accepted", ""), "label source"),
    (lambda s, ep: s.start_episode(""), "channel_id"),
    (lambda s, ep: s.channel_history("dev", -1), "limit"),
    (lambda s, ep: s.add_event("dev", ep + 99, "swap", {}), "no episode"),
    (lambda s, ep: s.update_job(12345, state="running"), "no job 12345"),
    (lambda s, ep: s.update_job(12345, state="sleeping"), "unknown job state"),
    (lambda s, ep: s.jobs(states=["sleeping"]), "unknown job state"),
    (lambda s, ep: s.set_release_state(12345, "live"), "no release 12345"),
    (lambda s, ep: s.set_release_state(12345, "shipped"), "unknown release state"),
]


@pytest.mark.parametrize("call, message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
async def test_bad_input_raises_value_error_naming_the_problem(store, call, message):
    ep = await store.start_episode("dev")
    with pytest.raises(ValueError, match=message):
        await call(store, ep)


async def test_duplicate_release_name_is_refused(store):
    await store.add_release("night-1", "/r/1", {})
    with pytest.raises(ValueError, match="'night-1' already exists"):
        await store.add_release("night-1", "/r/1b", {})


def test_store_imports_neither_discord_nor_torch():
    code = (
        "import sys, core.storage.store; "
        "bad = [m for m in ('torch', 'discord') if m in sys.modules]; "
        "assert not bad, bad"
    )
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


async def test_acknowledged_steps_survive_sigkill_of_the_writer(tmp_path):
    writer = _load_writer()
    rng = random.Random(20240611)
    path = tmp_path / "crash.db"
    results = [
        await writer.crash_once(path, delay=rng.uniform(0.05, 0.4), channels=3, seed=i)
        for i in range(20)
    ]
    assert all(r.acked > 0 for r in results)
    assert [r.integrity for r in results] == ["ok"] * 20
    assert [r.gaps for r in results] == [0] * 20
    assert [r.lost for r in results] == [0] * 20
    async with await Store.open(path) as store:
        episodes = await store.episodes_since(0)
    assert len(episodes) == 20 * 3
    assert sum(len(e.steps) for e in episodes) >= sum(r.acked for r in results)
