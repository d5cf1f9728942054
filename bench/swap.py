"""Benchmark the model swap: what a client chatting in a loop sees during it.

One server, one client looping on short chats (max_tokens 3) through ``LLM``.
First a blue/green swap to a copy of the model, then a restart-mode swap back
to the original. For each: failed requests, total requests and the longest gap
between two answers, over the swap plus ``--around`` seconds either side.

    python bench/swap.py [--gguf PATH] [--around 1.0]

The GGUF is found as the tests find it: --gguf, else $NIGHTSHIFT_TEST_GGUF,
else data/models/smollm2-135m-instruct-q8_0.gguf.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from core.config import Config
from serving.client import LLM
from serving.supervisor import ServerSupervisor
from fixtures import find_gguf, free_port

CHAT = [{"role": "user", "content": "Say hello."}]


def copy_of(gguf: Path, directory: Path) -> Path:
    copy = directory / f"copy-{gguf.name}"
    try:
        os.link(gguf, copy)
    except OSError:  # another file system
        shutil.copy(gguf, copy)
    return copy


class ChatLoop:
    """Chats in a loop; records when each answer came and each failure."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.answers: list[float] = []
        self.failures: list[tuple[float, str]] = []

    async def run(self) -> None:
        while True:
            try:
                await self.llm.chat(CHAT, max_tokens=3, temperature=0)
            except Exception as exc:  # the benchmark counts failures of any kind
                self.failures.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))
            else:
                self.answers.append(time.monotonic())


async def measure(
    loop: ChatLoop, supervisor: ServerSupervisor, gguf: Path, mode: str, around: float
) -> str:
    await asyncio.sleep(around)
    start = time.monotonic()
    await supervisor.swap(gguf, mode=mode, reason="benchmark")
    took = time.monotonic() - start
    await asyncio.sleep(around)
    window = (start - around, time.monotonic())
    answers = [t for t in loop.answers if window[0] <= t <= window[1]]
    failed = [why for t, why in loop.failures if window[0] <= t <= window[1]]
    marks = [window[0], *answers, window[1]]  # the window's edges count: waiting is waiting
    gaps = [b - a for a, b in zip(marks, marks[1:])]
    line = (
        f"{mode:<10}: {len(failed)} failed of {len(answers) + len(failed)} requests; "
        f"longest gap between answers {max(gaps) * 1000:.0f} ms "
        f"(median {statistics.median(gaps) * 1000:.0f} ms); swap took {took:.2f} s"
    )
    return "\n".join([line, *(f"    failure: {why}" for why in failed)])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", help="the GGUF to serve")
    parser.add_argument("--around", type=float, default=1.0, help="seconds of chat either side")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR, format="  [%(name)s] %(message)s")
    gguf = find_gguf(args.gguf)
    print(f"gguf: {gguf} ({gguf.stat().st_size / 2**20:.0f} MiB), cpus: {os.cpu_count()}")
    with tempfile.TemporaryDirectory(prefix="nightshift-bench-") as tmp:
        copy = copy_of(gguf, Path(tmp))
        config = Config.model_validate(
            {"paths": {"data_dir": tmp}, "server": {"port": free_port()},
             "watchdog": {"interval_s": 1.0, "restart_cooldown_s": 0}}
        )  # fmt: skip
        supervisor = ServerSupervisor(config, gguf=gguf)
        await supervisor.start()
        try:
            async with LLM(config, supervisor) as llm:
                await llm.chat(CHAT, max_tokens=3)  # warm, so the first gap is not the start
                loop = ChatLoop(llm)
                task = asyncio.create_task(loop.run(), name="bench chat loop")
                try:
                    print(await measure(loop, supervisor, copy, "blue-green", args.around))
                    print(await measure(loop, supervisor, gguf, "restart", args.around))
                finally:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
        finally:
            await supervisor.stop()


if __name__ == "__main__":
    asyncio.run(main())
