"""Benchmark the server supervisor: start-to-ready and restart-after-hang.

start-to-ready: spawn -> /v1/models answers -> the canary passes (median of N).
restart-after-hang: SIGSTOP the server -> the watchdog's canaries fail K times ->
SIGKILL and a fresh start -> the first chat request (sent while hung) succeeds.
The hang figure is dominated by the watchdog settings, which are printed.

    python bench/server.py [--gguf PATH] [--runs 3]

The GGUF is found as the tests find it: --gguf, else $NIGHTSHIFT_TEST_GGUF,
else data/models/smollm2-135m-instruct-q8_0.gguf.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from core.config import Config
from serving.client import LLM
from serving.supervisor import ServerSupervisor
from fixtures import find_gguf, free_port

WATCHDOG = {"interval_s": 1.0, "canary_timeout_s": 2.0, "failures_before_restart": 2,
            "restart_cooldown_s": 0}  # fmt: skip
CHAT = [{"role": "user", "content": "Say hello."}]


def make_config(data_dir: Path) -> Config:
    paths, server = {"data_dir": str(data_dir)}, {"port": free_port()}
    return Config.model_validate({"paths": paths, "server": server, "watchdog": WATCHDOG})


async def start_to_ready(gguf: Path, data_dir: Path) -> float:
    supervisor = ServerSupervisor(make_config(data_dir), gguf=gguf)
    started = time.perf_counter()
    await supervisor.start(watchdog=False)
    seconds = time.perf_counter() - started
    await supervisor.stop()
    return seconds


async def restart_after_hang(gguf: Path, data_dir: Path) -> tuple[float, float]:
    """Seconds from SIGSTOP to the watchdog's restart decision, and to the first good chat."""
    config = make_config(data_dir)
    supervisor = ServerSupervisor(config, gguf=gguf)
    await supervisor.start()
    try:
        async with LLM(config, supervisor, backoff_s=0.1) as llm:
            await llm.chat(CHAT, max_tokens=1)  # warm, so the figure is about the hang alone
            os.kill(supervisor.pid, signal.SIGSTOP)
            hung = time.perf_counter()
            pending = asyncio.create_task(llm.chat(CHAT, max_tokens=1))
            while supervisor.restarts == 0:
                await asyncio.sleep(0.01)
            detected = time.perf_counter() - hung
            await pending
            return detected, time.perf_counter() - hung
    finally:
        await supervisor.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", help="the GGUF to serve")
    parser.add_argument("--runs", type=int, default=3, help="start-to-ready samples")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="  [%(name)s] %(message)s")
    gguf = find_gguf(args.gguf)
    print(f"gguf: {gguf} ({gguf.stat().st_size / 2**20:.0f} MiB), cpus: {os.cpu_count()}")
    with tempfile.TemporaryDirectory(prefix="nightshift-bench-") as tmp:
        data_dir = Path(tmp)
        starts = [await start_to_ready(gguf, data_dir) for _ in range(args.runs)]
        print(
            f"start-to-ready: median {statistics.median(starts):.2f} s "
            f"over {args.runs} runs ({', '.join(f'{s:.2f}' for s in starts)})"
        )
        detected, total = await restart_after_hang(gguf, data_dir)
        dog = WATCHDOG
        print(
            f"restart-after-hang: {total:.2f} s from SIGSTOP to the first successful chat "
            f"(restart decided after {detected:.2f} s; watchdog interval {dog['interval_s']} s, "
            f"canary timeout {dog['canary_timeout_s']} s, "
            f"K={dog['failures_before_restart']})"
        )


if __name__ == "__main__":
    asyncio.run(main())
