"""A turn's start in one commit: the episode, its system prompt and the user's message."""

from __future__ import annotations

import sqlite3

import pytest

from core.storage.store import Step, Store


@pytest.fixture
async def store(tmp_path):
    s = await Store.open(tmp_path / "store.db")
    yield s
    await s.close()


async def test_start_turn_opens_the_episode_with_its_first_steps(store, tmp_path):
    episode, stored = await store.start_turn("general", "m1", [
        Step(role="system", content="sys", meta={"tools_ref": "abc"}),
        Step(role="user", content="hi", name="ada")], name="general")
    assert [(s.seq, s.role, s.episode_id) for s in stored] == [
        (0, "system", episode), (1, "user", episode)]
    assert stored[0].model_version == "m1"
    later = await store.add_step(episode, Step(role="assistant", content="hello"))
    assert later.seq == 2
    # committed: another connection (another process, the trainer) sees all of it
    with sqlite3.connect(tmp_path / "store.db") as db:
        assert db.execute("SELECT COUNT(*) FROM steps WHERE episode_id = ?",
                          (episode,)).fetchone()[0] == 3
        assert db.execute("SELECT name FROM channels WHERE id = 'general'").fetchone()[0] \
            == "general"


async def test_a_failed_start_leaves_nothing_behind(store, tmp_path):
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        await store.start_turn("general", None, [
            Step(role="system", content="sys"),
            Step(role="user", content="hi", meta={"bad": object()})])
    with pytest.raises(ValueError, match="role"):
        await store.start_turn("general", None, [Step(role="wizard", content="x")])
    with sqlite3.connect(tmp_path / "store.db") as db:
        assert db.execute("SELECT COUNT(*) FROM episodes").fetchone()[0] == 0
        assert db.execute("SELECT COUNT(*) FROM steps").fetchone()[0] == 0


async def test_a_channel_name_is_kept_unless_a_new_one_is_given(store):
    await store.start_turn("c1", None, [], name="first")
    await store.start_turn("c1", None, [])
    rows = await store._fetch("SELECT name FROM channels WHERE id = 'c1'")
    assert rows[0]["name"] == "first"
    await store.start_turn("c1", None, [], name="renamed")
    rows = await store._fetch("SELECT name FROM channels WHERE id = 'c1'")
    assert rows[0]["name"] == "renamed"
