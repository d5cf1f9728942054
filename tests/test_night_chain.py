"""Adapter mode chains nights: night N+1 trains on top of night N. Its base checkpoint is
the one N was trained on, it continues N's adapter (so pi_lag, the model the data came
from, is N), and its gate's "before" is N as served (its GGUF with N's LoRA)."""

from __future__ import annotations

from core.config import Config
from core.storage.store import Store
from trainer import sleep


async def test_a_chained_second_night_loads_the_first_nights_adapter_as_base_and_pi_lag(
        tmp_path, monkeypatch):
    config = Config()
    config.paths.data_dir = tmp_path
    config.night.export_mode = "adapter"
    first = tmp_path / "releases" / "night-0001"
    first.mkdir(parents=True)
    (first / "adapter_model.safetensors").write_bytes(b"night 1's LoRA")
    (first / "adapter_config.json").write_text("{}")
    base_hf, base_gguf = tmp_path / "base-hf", tmp_path / "base-q8_0.gguf"
    lora = first / "adapter-f16.gguf"
    seen: dict = {}

    async def judge(self):
        return tmp_path / "train.jsonl"

    async def train(self, dataset, base_dir, start_adapter=None):
        seen["train"] = (base_dir, start_adapter)
        return {"steps": 1}

    async def remember(self):
        pass

    async def export(self, base_dir, steps, gguf):
        seen["export"] = (base_dir, gguf)
        out = tmp_path / "releases" / "night-0002"
        out.mkdir()
        (out / "release.json").write_text(
            '{"serve": {"gguf": "%s", "lora": "adapter-f16.gguf"}}' % base_gguf)
        return out

    async def measure_live(self, dataset, live):
        seen["measured"] = live

    async def gate(self, dataset, live, release):
        seen["gate"] = live
        return {"outcome": "reject", "reasons": ["planted"]}

    for name, fake in (("judge", judge), ("measure_live", measure_live), ("train", train),
                       ("remember", remember), ("export", export), ("gate", gate)):
        monkeypatch.setattr(sleep.Night, name, fake)
    async with await Store.open(config.store_path) as store:
        release = await store.add_release("night-0001", str(first), {
            "gguf": str(base_gguf), "lora": str(lora), "merged_dir": None,
            "hf_base": str(base_hf), "night": 1})
        await store.set_release_state(release, "live")
        second = await store.create_job("sleep", {})
    await sleep.run_night(config, job_id=second)
    # Trained on night 1's base checkpoint, continuing night 1's adapter: pi_lag is night 1
    # (trainer.train computes it with that adapter loaded, before the first update;
    # tests/test_train.py checks that part on a tiny model).
    assert seen["train"] == (base_hf, first)
    assert seen["export"] == (base_hf, base_gguf)  # its export's base, too
    # Its gate's "before" is night 1 as served: the base GGUF with night 1's LoRA, measured
    # before the training (its time is kept from the training's budget).
    assert seen["measured"] == seen["gate"] == (base_gguf, lora)
    async with await Store.open(config.store_path) as store:
        job = await store.job(second)
        releases = {r["name"]: r for r in await store.releases()}
    assert job["error"] == "" and job["progress"]["base_release"] == release
    assert releases["night-0002"]["meta"]["base_release_id"] == release
    assert releases["night-0002"]["meta"]["hf_base"] == str(base_hf)
