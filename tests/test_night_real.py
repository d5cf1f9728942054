"""The night's judging through the real llama.cpp server and the embedded model."""

from __future__ import annotations

import pytest

from core.config import Config
from core.storage.embedder import MiniLMEmbedder
from core.storage.events import Event
from core.storage.store import Step, Store
from serving.supervisor import ServerSupervisor
from trainer.client import JsonClient
from trainer.night import run_part1
from trainer.value import ValueMemory

DAY = [
    ("general", "What is 2 + 3?", "2 + 3 = 5."),
    ("general", "Write a haiku about the sea.", "Waves fold into foam / salt wind combs the grey water / gulls stitch sky to shore"),
    ("code", "List the files here.", None),
    ("code", "Thanks!", "You're welcome."),
]


async def store_day(store: Store) -> list[int]:
    episodes = []
    for channel, ask, answer in DAY:
        ep = await store.start_episode(channel)
        await store.add_step(ep, Step(role="system", content="You are helpful.", meta={"tools": []}))
        await store.add_step(ep, Step(role="user", content=ask))
        if answer is None:
            calls = [{"id": "c1", "type": "function",
                      "function": {"name": "list_dir", "arguments": '{"path": "."}'}}]
            await store.add_step(ep, Step(role="assistant", content="", tool_calls=calls))
            await store.add_step(ep, Step(role="tool", content="notes.txt\nmain.py", name="list_dir",
                                          tool_call_id="c1"))
            answer = "There are two files: notes.txt and main.py."
        await store.add_step(ep, Step(role="assistant", content=answer))
        await store.end_episode(ep, "complete")
        episodes.append(ep)
    return episodes


@pytest.mark.slow
async def test_every_window_of_a_small_day_is_judged_by_the_embedded_model(
        tmp_path, served_gguf, free_port):
    config = Config()
    config.paths.data_dir = tmp_path
    config.model.gguf = served_gguf
    config.model.hf_dir = served_gguf.parent / "smollm2-135m-instruct-hf"
    config.server.port = free_port
    config.night.window_messages = 4
    config.night.understanding_fraction = 1.0
    supervisor = ServerSupervisor(config)
    await supervisor.start(watchdog=False)
    store = await Store.open(tmp_path / "store.db")
    client = JsonClient(supervisor.base_url, config.model.alias, 120)
    try:
        sums, haiku, _, _ = await store_day(store)
        await store.add_event("general", sums, Event.VERIFIER_REWARD, {"reward": 1.0, "check": "exact"})
        await store.add_label(haiku, "accepted", "reaction")
        memory = ValueMemory(tmp_path / "value", MiniLMEmbedder())
        result = await run_part1(config, store, 1, client, memory, since=0.0, until=1e12)
        records = await store.records(1, "judgment")
    finally:
        await client.close()
        await store.close()
        await supervisor.stop()
    assert records and all(r["status"] == "judged" for r in records.values()), records
    assert result.counts["windows_skipped"] == 0
    assert result.counts["understood"] == 2  # the checked and the labelled episode are ruled
    assert result.counts["source:verifier"] == 1 and result.counts["source:person"] == 1
    assert result.agreement["person"]["n"] + result.agreement["person"]["uncovered"] == 1
    assert result.manifest["judge_agreement"] == result.agreement
    assert result.dataset.is_file()
