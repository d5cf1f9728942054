"""Benchmark of the harness's own cost per turn.

1. Turns/s across 50 channels against a zero-latency scripted OpenAI-compatible
   server (a separate process answering a canned completion), through the real
   runtime: channel workers, agent loop, tool registry, SQLite store, HTTP client.
   It also prints the CPU each part used per turn: the harness's event loop (the
   part that bounds its throughput, one thread), the whole harness process, the
   store's writer process (``core.storage.writer``: the group commits, on the other
   core), and the scripted server, a separate process whose cost is the fake's own,
   not the harness's. On a loaded machine the wall-clock
   rate moves with other jobs; the CPU per turn does much less.
2. The harness's share of a turn's wall time with the embedded model served by
   the real llama.cpp server: (turn time - time inside the model call) / turn time.

    .venv/bin/python bench/agent.py [--turns 2000] [--channels 50] [--model-turns 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.config import Config  # noqa: E402
from fixtures import DEFAULT_GGUF, free_port  # noqa: E402
from serving.client import LLM  # noqa: E402
from bot.runtime import Runtime  # noqa: E402

CANNED = {"id": "c", "object": "chat.completion", "created": 0, "model": "scripted",
          "choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": "Done."}}],
          "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}


def _serve(port_queue: multiprocessing.Queue) -> None:
    from aiohttp import web

    body = json.dumps(CANNED)

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text=body, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_queue.put(runner.addresses[0][1])
        await asyncio.Event().wait()

    asyncio.run(main())


class FixedServer:
    """Stands in for the supervisor when the server is not ours to run."""

    def __init__(self, base_url: str, gguf: Path) -> None:
        self.base_url, self.gguf = base_url, gguf
        self.ready, self.pid, self.restarts, self.last_restart_reason = True, None, 0, None

    async def wait_ready(self, timeout: float | None = None) -> None:
        return None

    async def stop(self) -> None:
        return None


@dataclass
class Throughput:
    turns_per_s: float
    loop_us: float  # the event loop thread's CPU per turn
    process_us: float  # the harness process's CPU per turn (the loop and its other threads)
    writer_us: float | None  # the store's writer process's CPU per turn (None: not on Linux)
    server_us: float | None  # the scripted server's CPU per turn (None: not on Linux)
    commits: int  # group-commit transactions
    operations: int  # store operations in them


def _cpu_s(pid: int) -> float | None:
    """A process's user + system CPU seconds, from /proc (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def scripted_throughput(turns: int, channels: int, data_dir: Path,
                              tools: str = "auto") -> Throughput:
    queue: multiprocessing.Queue = multiprocessing.Queue()
    server = multiprocessing.Process(target=_serve, args=(queue,), daemon=True)
    server.start()
    try:
        port = queue.get(timeout=30)
        config = Config()
        config.paths.data_dir = data_dir
        config.agent.queue_size = turns
        config.agent.tools = tools
        if DEFAULT_GGUF.is_file():  # as a user has it: its chat format is read once, not
            config.model.gguf = DEFAULT_GGUF  # looked for on every request as a missing file is
        base = f"http://127.0.0.1:{port}/v1"
        llm = LLM(config, base_url=base)
        rt = await Runtime.start(config, supervisor=FixedServer(base, config.served_gguf),
                                 llm=llm, start_server=False)
        try:
            # One turn per channel first: a channel's first turn makes its workspace,
            # journal and state directories, once in its life; the figure is the steady state.
            await asyncio.gather(*(rt.turn(f"ch{i}", "hi") for i in range(channels)))
            commits = rt.store._commits  # noqa: SLF001 - the bench reads its counters
            batches0, operations0 = commits.batches, commits.operations
            writer_pid = commits._proc.pid  # noqa: SLF001
            server0, loop0, process0 = _cpu_s(server.pid), time.thread_time(), time.process_time()
            writer0 = _cpu_s(writer_pid)
            started = time.perf_counter()
            futures = [rt.workers.enqueue(f"ch{i % channels}", f"message {i}")
                       for i in range(turns)]
            results = await asyncio.gather(*futures)
            elapsed = time.perf_counter() - started
            loop_s, process_s = time.thread_time() - loop0, time.process_time() - process0
            server1, writer1 = _cpu_s(server.pid), _cpu_s(writer_pid)
            assert all(r.ok for r in results)
        finally:
            await rt.close()
            await llm.close()
        def per_turn(before: float | None, after: float | None) -> float | None:
            return None if before is None or after is None else (after - before) / turns * 1e6

        return Throughput(turns / elapsed, loop_s / turns * 1e6, process_s / turns * 1e6,
                          per_turn(writer0, writer1), per_turn(server0, server1),
                          commits.batches - batches0,
                          commits.operations - operations0)
    finally:
        server.kill()


async def model_share(turns: int, data_dir: Path) -> tuple[float, float, float]:
    config = Config()
    config.paths.data_dir = data_dir
    config.model.gguf = ROOT / "data/models/smollm2-135m-instruct-q8_0.gguf"
    config.model.hf_dir = ROOT / "data/models/smollm2-135m-instruct-hf"
    config.agent.max_reply_tokens = 32
    config.agent.max_steps = 2
    config.server.port = free_port()
    rt = await Runtime.start(config)
    model_ms: list[float] = []
    chat = rt.llm.chat

    async def timed_chat(*args, **kwargs):
        reply = await chat(*args, **kwargs)
        model_ms.append(reply.duration_ms)
        return reply

    rt.llm.chat = timed_chat  # type: ignore[method-assign]
    try:
        await rt.turn("general", "hello")
        model_ms.clear()
        turn_ms = []
        for i in range(turns):
            started = time.perf_counter()
            await rt.turn("general", f"Say one word about the number {i}.")
            turn_ms.append((time.perf_counter() - started) * 1000)
    finally:
        await rt.close()
    total, inside = sum(turn_ms), sum(model_ms)
    return (total - inside) / total, statistics.median(turn_ms), (total - inside) / turns


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--channels", type=int, default=50)
    parser.add_argument("--model-turns", type=int, default=3)
    parser.add_argument("--tools", default="auto,all",
                        help="agent.tools profiles to measure, comma-separated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for tools in args.tools.split(","):
            run = asyncio.run(scripted_throughput(args.turns, args.channels,
                                                  Path(tmp) / f"a-{tools}", tools))
            server = "n/a" if run.server_us is None else f"{run.server_us:.0f}"
            writer = "n/a" if run.writer_us is None else f"{run.writer_us:.0f}"
            print(f"scripted server, agent.tools = {tools!r}: {run.turns_per_s:,.0f} turns/s "
                  f"across {args.channels} channels ({args.turns} turns; goal >= 2,000)\n"
                  f"  CPU per turn: harness event loop {run.loop_us:.0f} us, harness process "
                  f"{run.process_us:.0f} us, store writer process {writer} us, scripted "
                  f"server {server} us; "
                  f"the loop alone would allow {1e6 / run.loop_us:,.0f} turns/s\n"
                  f"  store: {run.operations} operations in {run.commits} group commits "
                  f"({run.operations / max(run.commits, 1):.1f} per commit)")
        if args.model_turns <= 0:
            return
        share, median_ms, overhead_ms = asyncio.run(model_share(args.model_turns, Path(tmp) / "b"))
        print(f"embedded model: harness share {share * 100:.2f}% of turn wall time "
              f"(median turn {median_ms:.0f} ms, harness {overhead_ms:.1f} ms/turn; goal <= 2%)")


if __name__ == "__main__":
    main()
