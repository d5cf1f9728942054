"""/forget in the store: open episodes, a turn racing the forget, and what later writes may
not bring back (issue 40, part 4). Real SQLite, the real writer process, a scripted model."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bot.agent.loop import FORGOTTEN_NOTE
from core.storage.forgetting import EpisodeForgotten
from core.storage.store import Prefix, Step, Store
from tests.scripted import call, say
from tests.test_agent import make_agent

PLANTED = "PLANTED-forget-7f3a9c"


@pytest.fixture
async def store(tmp_path):
    s = await Store.open(tmp_path / "store.db")
    yield s
    await s.close()


def found_in_store(path: Path, text: str = PLANTED) -> list[str]:
    """Every table and column whose text holds ``text``, read through SQL."""
    hits = []
    with sqlite3.connect(path) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            columns = [r[1] for r in db.execute(f"PRAGMA table_info('{table}')")]
            for column in columns:
                n = db.execute(f"SELECT COUNT(*) FROM '{table}' WHERE CAST(\"{column}\" AS TEXT) "
                               "LIKE ?", (f"%{text}%",)).fetchone()[0]
                if n:
                    hits.append(f"{table}.{column}")
    return hits


def in_files(folder: Path, text: str = PLANTED) -> list[str]:
    """Files under ``folder`` whose bytes hold ``text`` (the SQLite file, its log...)."""
    return [str(p) for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


async def open_turn(store: Store, channel: str = "c", text: str = PLANTED) -> int:
    episode, _ = await store.start_turn(channel, "m", [
        Step(role="system", content="sys"), Step(role="user", content=f"remember {text}")])
    await store.add_step(episode, Step(role="assistant", content=f"noted: {text}"))
    return episode


async def test_an_open_episode_left_by_a_crash_can_be_forgotten(store, tmp_path):
    episode = await open_turn(store)  # its turn never ended
    forgotten = await store.forget_episode(episode)
    assert forgotten.was_open and forgotten.steps == 3 and forgotten.checkpointed
    assert await store.episode_status(episode) == "aborted"
    assert await store.is_forgotten(episode)
    assert await store.channel_history("c", 20) == []
    assert found_in_store(tmp_path / "store.db") == []
    await store.close()  # nothing in the file's free pages or its write-ahead log either
    assert in_files(tmp_path) == []


async def test_writes_after_the_forget_are_refused_or_blank(store, tmp_path):
    episode = await open_turn(store)
    await store.forget_episode(episode)
    with pytest.raises(EpisodeForgotten, match=f"episode {episode} was forgotten"):
        await store.add_step(episode, Step(role="assistant", content=f"again {PLANTED}"))
    await store.end_episode(episode, "complete")  # the forget closed it: a no-op
    assert await store.episode_status(episode) == "aborted"
    await store.add_event("c", episode, "compaction", {"summary": PLANTED})
    await store.add_event("c", episode, "discord_reply", {"message_id": 1, "author_id": 2})
    kinds = {e["kind"]: e["payload"] for e in await store.events(episode_id=episode)}
    assert kinds == {"compaction": {}, "discord_reply": {"message_id": 1, "author_id": 2}}
    assert found_in_store(tmp_path / "store.db") == []


async def test_a_later_turn_that_read_it_stores_no_prefix_or_summary_of_it(store, tmp_path):
    """The next turn read the channel's history before the forget; what it stores after
    it must not carry the text again."""
    episode = await open_turn(store)
    await store.end_episode(episode, "complete")
    history = [{"role": "user", "content": f"remember {PLANTED}"}]
    await store.forget_episode(episode)
    later, _ = await store.start_turn("c", "m", [Step(role="user", content="next")],
                                      prefix=Prefix(history, None, (episode,)))
    summary = Prefix([{"role": "user", "content": f"Summary: {PLANTED}"}], None, (episode,))
    await store.add_step(later, Step(role="assistant", content="ok",
                                     meta={"context": {"prefix": summary.ref, "tail": 1}}),
                         prefix=summary)
    await store.add_event("c", later, "compaction", {"summary": PLANTED,
                                                     "sources": [episode, later]})
    assert found_in_store(tmp_path / "store.db") == []


async def test_summaries_and_ledger_records_made_from_it_are_erased(store, tmp_path):
    episode = await open_turn(store)
    await store.end_episode(episode, "complete")
    # A later turn that read it: its prefix, and a compaction summary from before events
    # named their sources (found through the step that was sent the prefix).
    later, _ = await store.start_turn("c", "m", [Step(role="user", content="next")])
    prefix = Prefix([{"role": "user", "content": PLANTED}], None, (episode,))
    await store.add_step(later, Step(role="assistant", content="ok",
                                     meta={"context": {"prefix": prefix.ref, "tail": 1}}),
                         prefix=prefix)
    await store.add_event("c", later, "compaction", {"summary": f"they said {PLANTED}"})
    await store.end_episode(later, "complete")
    other, _ = await store.start_turn("d", "m", [Step(role="user", content="unrelated")])
    await store.add_event("d", other, "compaction", {"summary": "kept"})
    await store.put_record(1, "judgment", "c:0", {"subtasks": [{"description": PLANTED}],
                                                   "episodes": [episode, later]})
    await store.put_record(1, "prediction", "c:0:3", {"prompt": PLANTED,
                                                      "episodes": [episode]})
    await store.put_record(0, "judgment", "c:9", {"subtasks": [{"description": PLANTED}]})
    await store.put_record(1, "understanding", str(episode), {"score": 1.0})
    await store.put_record(1, "judgment", "d:0", {"subtasks": [], "episodes": [other]})
    forgotten = await store.forget_episode(episode)
    assert forgotten.summaries == 1 and forgotten.records == 4
    assert found_in_store(tmp_path / "store.db") == []
    assert list(await store.records(1, "judgment")) == ["d:0"]
    assert (await store.events(episode_id=other))[0]["payload"] == {"summary": "kept"}
    # A night still running judged it before the forget: its record is not stored.
    assert not await store.put_record(1, "judgment", "c:20", {"episodes": [episode]})
    assert await store.put_record(1, "judgment", "c:40", {"episodes": [later]})


async def test_a_turn_racing_the_forget_cannot_store_the_text_again(store, tmp_path):
    """The forget lands while the turn's tool runs: the observation (and anything after it)
    is refused, the turn stops and says so, and the store holds the text nowhere."""
    agent, llm, tools = make_agent(store, [call("add", {"a": 2, "b": 3}),
                                           say(f"the answer and {PLANTED}")], tmp_path)
    real_call = tools.call

    async def forgetting_call(name, arguments, ctx):
        rows = await store._fetch("SELECT id FROM episodes WHERE status = 'open'")
        await store.forget_episode(rows[0]["id"])  # /forget from another task, mid-turn
        result = await real_call(name, arguments, ctx)
        result.output += f" ({PLANTED})"
        return result

    tools.call = forgetting_call
    result = await agent.turn("general", f"what is 2+3? {PLANTED}")
    assert not result.ok and result.reply == FORGOTTEN_NOTE
    assert await store.is_forgotten(result.episode_id)
    assert await store.episode_status(result.episode_id) == "aborted"
    assert found_in_store(tmp_path / "store.db") == []
    # The channel's next turn is not shown it either.
    llm.script = [say("hello")]
    await agent.turn("general", "again")
    assert PLANTED not in str(llm.calls[-1][0])
