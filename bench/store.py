"""How fast the store takes durable steps, whether it stalls the event loop,
and whether acknowledged steps survive SIGKILL.

"Durable" here means the project's goal: committed (WAL, synchronous=NORMAL)
before add_step returns, so a process crash cannot lose the step; power loss
may. The stall is the worst overshoot of a 1 ms asyncio.sleep ticker that
runs alongside the writers: the time a Discord heartbeat would have waited.

    .venv/bin/python bench/store.py [--steps 20000] [--channels 50] [--crashes 50]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from core.storage.store import Step, Store  # noqa: E402

TOOL_CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "write_file", "arguments": '{"path": "notes.md", "text": "..."}'},
}


def _load_crash_helper():
    path = ROOT / "tests" / "store_writer.py"
    spec = importlib.util.spec_from_file_location("store_writer", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["store_writer"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _step(n: int) -> Step:
    # Roughly a chat turn: a few hundred characters, a tool call every other step.
    if n % 2:
        return Step(role="tool", content="ok: wrote 1234 bytes\n" * 8, tool_call_id="call_0")
    return Step(
        role="assistant",
        content="Let me write that down. " * 20,
        tool_calls=[TOOL_CALL],
        duration_ms=350.0,
        prompt_tokens=900,
        completion_tokens=60,
    )


class StallMeter:
    """Owns one ticker task; the worst overshoot of a 1 ms sleep, in ms."""

    def __init__(self) -> None:
        self.worst_ms = 0.0
        self._task: asyncio.Task | None = None

    async def _tick(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            over_ms = (time.perf_counter() - start - 0.001) * 1000
            self.worst_ms = max(self.worst_ms, over_ms)

    async def __aenter__(self) -> StallMeter:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


async def _writers(store: Store, channels: int, steps_each: int) -> tuple[float, list[float]]:
    """Run one task per channel; return elapsed seconds and per-step latencies."""
    latencies: list[float] = []

    async def channel(name: str) -> None:
        episode_id = await store.start_episode(name, model_version="bench")
        for n in range(steps_each):
            start = time.perf_counter()
            await store.add_step(episode_id, _step(n))
            latencies.append(time.perf_counter() - start)
        await store.end_episode(episode_id, "complete")

    start = time.perf_counter()
    await asyncio.gather(*(channel(f"bench-{channels}-{i}") for i in range(channels)))
    return time.perf_counter() - start, latencies


async def _throughput(db: Path, channels: int, total_steps: int) -> None:
    steps_each = max(1, total_steps // channels)
    async with await Store.open(db) as store:
        async with StallMeter() as stall:
            elapsed, latencies = await _writers(store, channels, steps_each)
    count = len(latencies)
    ms = sorted(x * 1000 for x in latencies)
    print(
        f"{channels:>2} writer(s): {count} steps in {elapsed:.2f} s = {count / elapsed:,.0f} "
        f"durable steps/s; add_step p50 {statistics.median(ms):.2f} ms, "
        f"p99 {ms[int(0.99 * (count - 1))]:.2f} ms; longest loop stall {stall.worst_ms:.2f} ms"
    )


async def _crashes(db: Path, runs: int, seed: int) -> None:
    helper = _load_crash_helper()
    rng = random.Random(seed)
    kills = integrity_failures = gaps = lost = acked = 0
    start = time.perf_counter()
    for i in range(runs):
        result = await helper.crash_once(db, rng.uniform(0.05, 0.4), channels=3, seed=i)
        kills += 1
        acked += result.acked
        integrity_failures += result.integrity != "ok"
        gaps += result.gaps
        lost += result.lost
    print(
        f"crash check: {kills} SIGKILLs in {time.perf_counter() - start:.1f} s, "
        f"{acked} acknowledged steps; integrity failures {integrity_failures}, "
        f"episodes with gaps {gaps}, acknowledged steps lost {lost}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000, help="steps per throughput run")
    parser.add_argument("--channels", type=int, default=50, help="concurrent channel writers")
    parser.add_argument("--crashes", type=int, default=50, help="SIGKILL rounds (0: skip)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", default=None, help="where to put the DB (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print(f"store in {tmp} (journal_mode=WAL, synchronous=NORMAL)")
        await _throughput(Path(tmp) / "single.db", 1, args.steps)
        await _throughput(Path(tmp) / "multi.db", args.channels, args.steps)
        if args.crashes:
            await _crashes(Path(tmp) / "crash.db", args.crashes, args.seed)


if __name__ == "__main__":
    asyncio.run(main())
