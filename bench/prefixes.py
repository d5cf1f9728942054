"""Benchmark: what storing each turn's prompt prefix (issue 9, part 3) costs a turn's start.

Times ``Store.start_turn`` (one transaction: channel, episode, system and user steps)
with and without the turn's prompt prefix (system prompt + 20 history messages),
interleaved in rounds so that a busy machine affects both alike; prints the medians.

    .venv/bin/python bench/prefixes.py [--turns 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.storage.store import Prefix, Step, Store  # noqa: E402

HISTORY = [{"role": "user" if i % 2 else "assistant", "content": "hello there " * 10}
           for i in range(20)]


async def one_round(store: Store, turns: int, with_prefix: bool) -> float:
    started = time.perf_counter()
    for i in range(turns):
        messages = [{"role": "system", "content": "s" * 300}, *HISTORY,
                    {"role": "user", "content": str(i)}]
        prefix = Prefix(messages[:-1] + [{"role": "user", "content": f"h{i}"}], "tools", (1,))
        await store.start_turn("c", "m", [Step(role="system", content="s"),
                                          Step(role="user", content=str(i))],
                               prefix=prefix if with_prefix else None)
    return (time.perf_counter() - started) / turns * 1000


async def main(turns: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(Path(tmp) / "bench.db")
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(rounds):
            for with_prefix in (False, True):
                times[with_prefix].append(await one_round(store, turns, with_prefix))
        await store.close()
    without, with_ = statistics.median(times[False]), statistics.median(times[True])
    print(f"start_turn: {without:.3f} ms without a prefix, {with_:.3f} ms with one "
          f"(+{with_ - without:.3f} ms per turn; median of {rounds} rounds of {turns} turns)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.rounds))
