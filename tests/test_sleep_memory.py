"""The night job updates the value memory only once its training has succeeded."""

from __future__ import annotations

from core.storage.embedder import MiniLMEmbedder
from core.storage.store import Store
from tests.test_night_judge import REPORT, config_for, report, serve, tool_episode
from trainer import sleep
from trainer.value import ValueMemory


async def test_the_value_memory_learns_the_night_only_after_training_succeeded(
        tmp_path, monkeypatch):
    def answer(kind, body):
        if kind == REPORT:
            return report([{"start": 0, "end": 3, "description": "add numbers", "score": 2}])
        return {"score": 0, "length": 2}

    server = await serve(answer)
    config = config_for(tmp_path)
    config.server.port = server.port
    async with await Store.open(config.store_path) as store:
        await tool_episode(store, "a")
        await tool_episode(store, "b")
    memory = ValueMemory(config.data_dir / "value-memory", MiniLMEmbedder())
    stages = []

    async def measured(self, dataset, live):
        stages.append("measure")

    async def failed_training(self, dataset, base_dir, start_adapter=None):
        stages.append("train")
        raise RuntimeError("out of memory")

    async def trained(self, dataset, base_dir, start_adapter=None):
        stages.append("train")
        return {"steps": 1}

    async def export_stops(self, base_dir, steps, base_gguf):
        stages.append(("export", memory.count()))
        raise RuntimeError("stop after the memory update")

    try:
        monkeypatch.setattr(sleep.Night, "measure_live", measured)
        monkeypatch.setattr(sleep.Night, "train", failed_training)
        job = await sleep.run_night(config, since=0.0)
        async with await Store.open(config.store_path) as store:
            assert "out of memory" in (await store.job(job))["error"]
        assert memory.count() == 0  # judged and predicted, but nothing learnt: not remembered

        monkeypatch.setattr(sleep.Night, "train", trained)
        monkeypatch.setattr(sleep.Night, "export", export_stops)
        requests = len(server.requests)
        await sleep.run_night(config, job_id=job)  # the resume judges from the ledger
        assert len(server.requests) == requests
    finally:
        await server.stop()
    assert stages == ["measure", "train", "measure", "train", ("export", 2)]
    async with await Store.open(config.store_path) as store:
        assert (await store.job(job))["progress"]["remembered"] is True
