"""A night already running honours /forget (issue 40, part 4): it drops the rows of an
episode forgotten before it trains, refuses its release when one it trained on is
forgotten after, and /promote refuses such a candidate. Real store; the judge is a
scripted server and the training is left out (``trainer.sleep.Night``'s stages are
replaced where they would need a model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.storage.store import Store
from serving.releases import Releases
from tests.scripted import say
from tests.test_agent import make_agent
from tests.test_night_judge import config_for, report, run, serve, tool_episode
from tests.test_nightwatch import make_release
from trainer import sleep
from trainer.forgets import ForgottenAfterTraining, drop_forgotten

PLANTED = "PLANTED-night-5d21e8"


def rows_for(episodes: dict[int, list[int]]) -> list[dict]:
    """Episode id -> its row's sources; plus a value prediction made from the first."""
    first = next(iter(episodes))
    rows = [{"kind": "episode", "episode_id": e, "sources": s, "split": "train",
             "messages": [{"role": "user", "content": f"{PLANTED} {s}"}]}
            for e, s in episodes.items()]
    rows.append({"kind": "value_prediction", "episode_id": None, "sources": [first],
                 "split": "train", "messages": [{"role": "user", "content": PLANTED}]})
    return rows


def write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def test_the_nights_rows_say_which_episodes_they_carry(tmp_path):
    """run_part1's rows: a later turn's row carries the earlier episode its history held,
    and a value prediction the episodes its sub-task was judged from; after the forget,
    drop_forgotten leaves no row with the earlier episode's text."""
    from core.storage.embedder import MiniLMEmbedder

    async with await Store.open(tmp_path / "store.db") as store:
        agent, _, _ = make_agent(store, [say("noted."), say("sure.")], tmp_path)
        first = (await agent.turn("general", f"remember {PLANTED}")).episode_id
        later = (await agent.turn("general", "and now?")).episode_id
        server = await serve(lambda kind, body: report(
            [{"start": 0, "end": 1, "description": f"asked to remember {PLANTED}",
              "score": 2}]) if kind == "judge_report" else {"score": 1, "length": 1})
        try:
            result, _ = await run(config_for(tmp_path), store, server, MiniLMEmbedder())
        finally:
            await server.stop()
        rows = [json.loads(line) for line in result.dataset.read_text().splitlines()]
        by_episode = {r["episode_id"]: r for r in rows if r["kind"] == "episode"}
        assert by_episode[first]["sources"] == [first]
        assert by_episode[later]["sources"] == [first, later]  # its prefix held the first
        values = [r for r in rows if r["kind"] == "value_prediction"]
        assert values and all(first in r["sources"] for r in values)
        records = await store.records(1, "judgment")
        assert all(set(r["episodes"]) == {first, later} for r in records.values())

        await store.forget_episode(first)
        kept, forgotten, dropped = await drop_forgotten(store, result.dataset)
        assert forgotten == {first} and dropped == len(rows) and kept == set()
        assert PLANTED not in result.dataset.read_text()
        assert await store.records(1, "judgment") == {}  # the ledger's records went too


async def night_with(config, monkeypatch, rows_of, *, during_training=(), during_gate=()):
    """Run a night whose judging writes ``rows_of(episodes)``, whose training records the
    rows it was given, and which forgets the episodes given while training or gating."""
    seen: dict = {}

    async def judge(self):
        await self.set("judging")
        self.progress.setdefault("collected_until", 1e12)
        return write(self.dir / "train.jsonl", rows_of)

    async def train(self, dataset, base_dir, start_adapter=None):
        seen["trained"] = [json.loads(line) for line in dataset.read_text().splitlines()]
        for episode in during_training:
            await self.store.forget_episode(episode)
        self.progress["trained"] = {"steps": 1}
        return {"steps": 1}

    async def export(self, base_dir, steps, base_gguf):
        seen["exported"] = True
        return Path(make_release(self.config.data_dir, f"night-{self.job_id:04d}")[0])

    async def measure_live(self, dataset, live):
        seen["measured"] = live

    async def gate(self, dataset, live, release):
        for episode in during_gate:
            await self.store.forget_episode(episode)
        return {"outcome": "promote", "passed": True, "reasons": ["planted"]}

    for name, stage in (("judge", judge), ("measure_live", measure_live), ("train", train),
                        ("export", export), ("gate", gate)):
        monkeypatch.setattr(sleep.Night, name, stage)
    job = await sleep.run_night(config, since=0.0)
    async with await Store.open(config.store_path) as store:
        return seen, await store.job(job), await store.releases()


@pytest.fixture
async def three(tmp_path):
    config = config_for(tmp_path)
    async with await Store.open(config.store_path) as store:
        ids = [(await tool_episode(store, ask=f"{PLANTED} {n}"))[0] for n in range(3)]
    return config, ids


async def test_a_running_night_drops_an_episode_forgotten_before_it_trains(three, monkeypatch):
    config, (a, b, c) = three
    rows = rows_for({a: [a], b: [b], c: [a, c]})  # c's history carried a
    async with await Store.open(config.store_path) as store:
        await store.forget_episode(a)  # after the night collected it, before it trains
    seen, job, releases = await night_with(config, monkeypatch, rows)
    assert [r["episode_id"] for r in seen["trained"]] == [b]  # c carried a; the value row too
    assert job["progress"]["trained_episodes"] == [b]
    assert job["progress"]["dropped_forgotten"] == {"episodes": [a], "rows": 3}
    assert job["state"] == "awaiting_promotion"
    assert releases[0]["meta"]["trained_episodes"] == [b]
    assert f"{PLANTED} [{a}" not in (config.data_dir / "nights" / f"night-{job['id']:04d}"
                                     / "train.jsonl").read_text()


@pytest.mark.parametrize("when", ["during_training", "during_gate"])
async def test_a_night_refuses_its_release_when_a_trained_episode_is_forgotten(
        three, monkeypatch, when):
    config, (a, b, c) = three
    seen, job, releases = await night_with(config, monkeypatch, rows_for({a: [a], b: [b]}),
                                           **{when: [a]})
    assert len(seen["trained"]) == 3  # it trained on a before the forget
    assert job["state"] == "failed" and f"#{a}" in job["error"]
    assert "forgotten after this night trained on them" in job["error"]
    assert releases == []  # never recorded, so never promoted
    assert seen.get("exported") is (None if when == "during_training" else True)
    dataset = config.data_dir / "nights" / f"night-{job['id']:04d}" / "train.jsonl"
    assert f"{PLANTED} [{a}]" not in dataset.read_text()


async def test_promote_refuses_a_candidate_trained_on_an_episode_forgotten_since(three):
    config, (a, b, c) = three
    async with await Store.open(config.store_path) as store:
        release = await store.add_release("night-0001", str(config.data_dir), {
            "gguf": "x.gguf", "trained_episodes": [a, b], "gate": {"outcome": "promote"}})
        await store.forget_episode(b)
        text = await Releases(config, store, supervisor=None).promote()
        assert text.startswith(f"Release #{release} refused") and f"#{b}" in text
        assert [r["state"] for r in await store.releases()] == ["rejected"]
        assert await Releases(config, store, supervisor=None).promote() == \
            "No candidate release to promote."
    with pytest.raises(ForgottenAfterTraining, match=f"#{b}"):
        async with await Store.open(config.store_path) as store:
            from trainer.forgets import refuse_if_forgotten
            await refuse_if_forgotten(store, [a, b], "at a test")
