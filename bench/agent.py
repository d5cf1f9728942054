"""Benchmark of the harness's own cost per turn.

1. Turns/s across 50 channels against a zero-latency scripted OpenAI-compatible
   server (a separate process answering a canned completion), through the real
   runtime: channel workers, agent loop, tool registry, SQLite store, HTTP client.
2. The harness's share of a turn's wall time with the embedded model served by
   the real llama.cpp server: (turn time - time inside the model call) / turn time.

    .venv/bin/python bench/agent.py [--turns 2000] [--channels 50] [--model-turns 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bot.config import Config  # noqa: E402
from fixtures import free_port  # noqa: E402
from bot.serving.client import LLM  # noqa: E402
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


async def scripted_throughput(turns: int, channels: int, data_dir: Path,
                              tools: str = "auto") -> float:
    queue: multiprocessing.Queue = multiprocessing.Queue()
    server = multiprocessing.Process(target=_serve, args=(queue,), daemon=True)
    server.start()
    try:
        port = queue.get(timeout=30)
        config = Config()
        config.paths.data_dir = data_dir
        config.agent.queue_size = turns
        config.agent.tools = tools
        base = f"http://127.0.0.1:{port}/v1"
        llm = LLM(config, base_url=base)
        rt = await Runtime.start(config, supervisor=FixedServer(base, config.served_gguf),
                                 llm=llm, start_server=False)
        try:
            await rt.turn("warmup", "hi")
            started = time.perf_counter()
            futures = [rt.workers.enqueue(f"ch{i % channels}", f"message {i}")
                       for i in range(turns)]
            results = await asyncio.gather(*futures)
            elapsed = time.perf_counter() - started
            assert all(r.ok for r in results)
        finally:
            await rt.close()
            await llm.close()
        return turns / elapsed
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
            rate = asyncio.run(scripted_throughput(args.turns, args.channels,
                                                   Path(tmp) / f"a-{tools}", tools))
            print(f"scripted server, agent.tools = {tools!r}: {rate:,.0f} turns/s across "
                  f"{args.channels} channels ({args.turns} turns; goal >= 2,000)")
        share, median_ms, overhead_ms = asyncio.run(model_share(args.model_turns, Path(tmp) / "b"))
        print(f"embedded model: harness share {share * 100:.2f}% of turn wall time "
              f"(median turn {median_ms:.0f} ms, harness {overhead_ms:.1f} ms/turn; goal <= 2%)")


if __name__ == "__main__":
    main()
