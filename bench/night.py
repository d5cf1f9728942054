"""Benchmark of the night, part 1, with the embedded model on CPU.

Prints the secret scan's MB/s, then runs part 1 over a stored day of
``--episodes`` synthetic episodes through the real llama.cpp server and prints
windows judged per minute and the wall time of each stage.

    .venv/bin/python bench/night.py [--episodes 64] [--scan-mb 8]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.config import Config  # noqa: E402
from fixtures import free_port  # noqa: E402
from core.storage.embedder import MiniLMEmbedder  # noqa: E402
from serving.supervisor import ServerSupervisor  # noqa: E402
from core.storage.store import Step, Store  # noqa: E402
from trainer.client import JsonClient  # noqa: E402
from trainer.night import run_part1  # noqa: E402
from trainer.secrets import SecretScanner  # noqa: E402
from trainer.value import ValueMemory  # noqa: E402

ASKS = ["What is {a} + {b}?", "Write a short note about {w}.", "List the files here.",
        "Explain {w} in one sentence.", "Rename {w}.txt to {w}-old.txt."]
WORDS = ["rivers", "tea", "compilers", "owls", "granite", "jazz", "orbits", "bread"]


def scan_rate(megabytes: int) -> float:
    rng = random.Random(0)
    line = "The agent wrote notes.txt and ran tests; all 12 passed in 0.4 s. "
    text = "\n".join(line + str(rng.random()) for _ in range(megabytes * 2**20 // 80))
    scanner = SecretScanner(["a-configured-token-value"])
    started = time.perf_counter()
    scanner.scan(text)
    return len(text) / 2**20 / (time.perf_counter() - started)


async def store_day(store: Store, episodes: int) -> None:
    rng = random.Random(1)
    for i in range(episodes):
        channel = f"ch{i % 4}"
        ask = rng.choice(ASKS).format(a=rng.randint(1, 99), b=rng.randint(1, 99), w=rng.choice(WORDS))
        ep = await store.start_episode(channel)
        await store.add_step(ep, Step(role="system", content="You are helpful.", meta={"tools": []}))
        await store.add_step(ep, Step(role="user", content=ask))
        if i % 3 == 0:
            calls = [{"id": f"c{i}", "type": "function",
                      "function": {"name": "list_dir", "arguments": '{"path": "."}'}}]
            await store.add_step(ep, Step(role="assistant", content="", tool_calls=calls))
            await store.add_step(ep, Step(role="tool", content="notes.txt\nmain.py", name="list_dir",
                                          tool_call_id=f"c{i}"))
        await store.add_step(ep, Step(role="assistant", content=f"Done: {ask.lower()}"))
        await store.end_episode(ep, "complete")


async def night(episodes: int, data: Path) -> None:
    config = Config()
    config.paths.data_dir = data
    config.model.gguf = ROOT / "data/models/smollm2-135m-instruct-q8_0.gguf"
    config.model.hf_dir = ROOT / "data/models/smollm2-135m-instruct-hf"
    config.server.port = free_port()
    supervisor = ServerSupervisor(config)
    await supervisor.start(watchdog=False)
    store = await Store.open(data / "store.db")
    client = JsonClient(supervisor.base_url, config.model.alias, 300)
    try:
        await store_day(store, episodes)
        memory = ValueMemory(data / "value", MiniLMEmbedder())
        started = time.perf_counter()
        result = await run_part1(config, store, 1, client, memory, since=0.0, until=1e12)
        total = time.perf_counter() - started
    finally:
        await client.close()
        await store.close()
        await supervisor.stop()
    counts, timings = result.counts, result.timings
    windows = counts["windows_judged"] + counts["windows_skipped"]
    print(f"day: {episodes} episodes, {windows} windows "
          f"({counts['windows_judged']} judged, {counts['windows_skipped']} skipped), "
          f"{counts['subtasks']} sub-tasks, {counts['understood']} understanding scores, "
          f"{counts['rows']} training rows, {client.requests} model requests")
    print(f"judging: {counts['windows_judged'] / (timings['judge'] / 60):.1f} windows judged per "
          "minute (embedded model, CPU)")
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
    print(f"stage wall times: {stages}; total {total:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--scan-mb", type=int, default=8)
    args = parser.parse_args()
    print(f"secret scan: {scan_rate(args.scan_mb):.2f} MB/s over {args.scan_mb} MB of clean text")
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(night(args.episodes, Path(tmp)))


if __name__ == "__main__":
    main()
