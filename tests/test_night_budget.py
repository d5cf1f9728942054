"""The night's time budget: training gets what ``night.budget_s`` leaves once the judging
and the gate's live side are done and the export (as long as it took last night) and the
candidate's side (1.3 times the live side) are reserved."""

from __future__ import annotations

import time

from core.config import Config
from core.storage.store import Step, Store
from trainer import sleep
from trainer.budget import resumed_clock
from trainer.gate import GateReport
from trainer.gate_items import agent_view
from trainer.gate_side import Side
from trainer.sleep import Night


async def night_at(tmp_path, budget_s: float = 1200.0) -> tuple[Config, Store]:
    config = Config()
    config.paths.data_dir = tmp_path
    config.night.budget_s = budget_s
    return config, await Store.open(config.store_path)


async def test_training_gets_the_budget_less_the_time_spent_the_export_and_the_candidate(
        tmp_path):
    config, store = await night_at(tmp_path)
    try:
        earlier = Night(config, store, await store.create_job("sleep", {}))
        earlier.progress["started_at"] = time.time()
        await earlier.set("judging")
        earlier.progress["stage_entered"] -= 100  # judged for 100 s
        await earlier.set("training")
        earlier.progress["stage_entered"] -= 500
        await earlier.set("exporting", trained={"tokens_per_s": 480.0})
        earlier.progress["stage_entered"] -= 40
        await earlier.set("gating")
        earlier.progress["stage_entered"] -= 160
        await earlier.set("done")
        assert earlier.progress["stage_seconds"] == {"judging": 100.0, "training": 500.0,
                                                     "exporting": 40.0, "gating": 160.0}
        tonight = Night(config, store, await store.create_job("sleep", {}))
        tonight.progress["started_at"] = time.time() - 300  # judged and measured: 300 s
        tonight.progress["gate_before_s"] = 100.0  # the live side took 100 s of them
        budget, rate = await tonight.training_budget()
        assert rate == 480.0
        # less last night's export and 1.3 times the live side, for the candidate's
        assert abs(budget - (1200 - 300 - 40 - 130)) < 2
    finally:
        await store.close()


async def test_a_first_night_reserves_a_twentieth_for_its_export_and_no_budget_no_limit(
        tmp_path):
    config, store = await night_at(tmp_path)
    try:
        first = Night(config, store, await store.create_job("sleep", {}))
        first.progress["started_at"] = time.time() - 60
        budget, rate = await first.training_budget()
        assert rate is None and abs(budget - (1200 - 60 - 300)) < 2  # unmeasured: a quarter
        first.progress["gate_before_s"] = 200.0
        budget, _ = await first.training_budget()
        assert abs(budget - (1200 - 60 - 60 - 260)) < 2  # no export timed yet: 5% of 1200
        first.progress["started_at"] = time.time() - 5000  # already past it: no time left
        assert (await first.training_budget())[0] == 0.0
        config.night.budget_s = 0
        assert await first.training_budget() == (None, None)
    finally:
        await store.close()


async def test_the_gate_reuses_the_live_side_only_while_the_same_model_serves(tmp_path,
                                                                              monkeypatch):
    config, store = await night_at(tmp_path)
    given = []

    async def measure_model(config, store, rows, args, live):
        return Side(scores={"q1": 1.0}, answers={"q1": "a user's words"},
                    open_answers=["hi"], failures=["q2: timed out"])

    async def run_gate(config, store, rows, args, before, after, check=None, measured=None):
        given.append((before, measured))
        return GateReport("inconclusive", [], 0, None, None, None, {})

    monkeypatch.setattr(sleep, "measure_model", measure_model)
    monkeypatch.setattr(sleep, "run_gate", run_gate)
    try:
        night = Night(config, store, await store.create_job("sleep", {}))
        dataset = tmp_path / "train.jsonl"
        dataset.write_text("")
        live = (tmp_path / "base.gguf", None)
        (tmp_path / "release").mkdir()
        (tmp_path / "release" / "release.json").write_text('{"serve": {"gguf": "m.gguf"}}')
        await night.measure_live(dataset, live)
        kept = (await store.job(night.job_id))["progress"]["gate_before"]
        assert kept["scores"] == {"q1": 1.0} and kept["answers"] == {}  # no user's text kept
        assert kept["failures"] == ["q2: timed out"] and night.progress["gate_before_s"] >= 0
        await night.gate(dataset, live, tmp_path / "release")
        night.progress.pop("gate")
        other = (tmp_path / "base.gguf", tmp_path / "night-1.gguf")  # another release serves
        await night.gate(dataset, other, tmp_path / "release")
    finally:
        await store.close()
    assert given[0][1] == Side(scores={"q1": 1.0}, open_answers=["hi"],
                               failures=["q2: timed out"])
    assert given[1] == (other, None)  # measured again by the gate


async def test_both_gate_sides_render_with_the_view_the_live_side_had(tmp_path, monkeypatch):
    """A night from the command line has no view file from the bot: it reads the tools of
    the newest episode, once, so a chat between the two sides does not change them."""
    config, store = await night_at(tmp_path)
    views = []

    async def measure_model(config, store, rows, args, live):
        views.append(await agent_view(config, store, args))
        return Side()

    async def run_gate(config, store, rows, args, before, after, check=None, measured=None):
        views.append(await agent_view(config, store, args))
        return GateReport("inconclusive", [], 0, None, None, None, {})

    monkeypatch.setattr(sleep, "measure_model", measure_model)
    monkeypatch.setattr(sleep, "run_gate", run_gate)
    old = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
    try:
        for tools in (old, old + [{"type": "function", "function": {"name": "run_python"}}]):
            episode = await store.start_episode("c1")
            await store.add_step(episode, Step(role="system", content="sys",
                                               meta={"tools": tools}))
            if tools == old:
                night = Night(config, store, await store.create_job("sleep", {}))
                dataset = tmp_path / "train.jsonl"
                dataset.write_text("")
                live = (tmp_path / "base.gguf", None)
                await night.measure_live(dataset, live)
        (tmp_path / "release").mkdir()
        (tmp_path / "release" / "release.json").write_text('{"serve": {"gguf": "m.gguf"}}')
        resumed = Night(config, store, night.job_id)  # as after a crash: the view is kept
        resumed.progress = (await store.job(night.job_id))["progress"]
        await resumed.gate(dataset, live, tmp_path / "release")
    finally:
        await store.close()
    assert views[0] == views[1] and views[0].tools == old
    assert views[0].system == config.agent.system_prompt


async def test_a_night_resumed_after_a_crash_does_not_count_the_time_it_lay_stopped(tmp_path):
    config, store = await night_at(tmp_path)
    try:
        night = Night(config, store, await store.create_job("sleep", {}))
        now = time.time()
        crashed = {"started_at": now - 7200 - 300, "stage": "exporting",
                   "stage_entered": now - 7200 - 10, "updated": now - 7200}  # two hours ago
        night.progress = resumed_clock(crashed, now)
        assert abs(night.progress["started_at"] - (now - 300)) < 1
        await night.set("gating")  # the export ran 10 s before the crash, and none after it
        assert 9 < night.progress["stage_seconds"]["exporting"] < 12
        budget, _ = await night.training_budget()
        assert abs(budget - (1200 - 300 - 300)) < 2  # not 0: the two hours are not spent
    finally:
        await store.close()
