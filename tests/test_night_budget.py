"""The night's time budget: training gets what ``night.budget_s`` leaves once the judging
is done and the export and the gate (as long as they took last night) are reserved."""

from __future__ import annotations

import time

from core.config import Config
from core.storage.store import Store
from trainer.sleep import Night


async def night_at(tmp_path, budget_s: float = 1200.0) -> tuple[Config, Store]:
    config = Config()
    config.paths.data_dir = tmp_path
    config.night.budget_s = budget_s
    return config, await Store.open(config.store_path)


async def test_training_gets_the_budget_less_the_time_spent_and_last_nights_gate(tmp_path):
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
        tonight.progress["started_at"] = time.time() - 300  # judged for 300 s
        budget, rate = await tonight.training_budget()
        assert rate == 480.0
        assert abs(budget - (1200 - 300 - 200)) < 2  # less last night's export and gate
    finally:
        await store.close()


async def test_a_first_night_reserves_a_quarter_and_no_budget_means_no_limit(tmp_path):
    config, store = await night_at(tmp_path)
    try:
        first = Night(config, store, await store.create_job("sleep", {}))
        first.progress["started_at"] = time.time() - 60
        budget, rate = await first.training_budget()
        assert rate is None and abs(budget - (1200 - 60 - 300)) < 2
        first.progress["started_at"] = time.time() - 5000  # already past it: no time left
        assert (await first.training_budget())[0] == 0.0
        config.night.budget_s = 0
        assert await first.training_budget() == (None, None)
    finally:
        await store.close()
