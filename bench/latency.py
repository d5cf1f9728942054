"""Benchmark a turn's latency on the embedded model: first turn, follow-up, other channel.

For the default tool set and for every tool, on a fresh server (the real
``python -m llama_cpp.server`` through the supervisor, with the config's
server settings), this runs what a day looks like to the server:

    #alpha first turn -> canary -> #beta first turn -> canary -> #alpha follow-up
                      -> canary -> #beta follow-up

Each turn is one model call as the agent makes it (``LLM.chat`` with the
system prompt, the channel's history, the tools, the agent's max_tokens and
temperature, and the client's tool_choice="none" re-ask when the answer comes
back empty); the canary is the watchdog's own. Without the prompt cache, the
canary and the other channel's turn overwrite the KV state the follow-up
could have reused.

Per HTTP request it prints, from the server's log (``serving.server_log``):
time to first token (from the start of the request's first completion to
its first generated token: the prompt, a restore from the cache included, and
one decode step; the HTTP and template work before it takes a few ms), the
prompt tokens, how many were reused from the KV state and how many were
read again, and whether a saved state was restored. The turn's total is the
client's wall clock. Then: follow-up/first ratios, the share of the
follow-up's prompt that came from the cache, the floor (the time to read the
follow-up's new tokens alone) and the share of turn calls that reused >= 90%
of their prompt.

    python bench/latency.py [--gguf PATH] [--tools default|all|both] [--prompt-cache-mb N]
                            [--notes] [--server-arg=ARG ...]

``--prompt-cache-mb 0`` measures without the prompt cache, for comparison (add
``--server-arg=--logits_all --server-arg=true`` for the settings before it);
``--notes`` adds a first turn in a channel with its own notes. When the default
tool set is every tool (``agent.tools = []``), one run measures both.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # before bench/, whose sandbox.py would shadow the package

from bot.agent.loop import Agent  # noqa: E402
from core.config import Config  # noqa: E402
from serving.client import LLM  # noqa: E402
from bot.runtime import _registry  # noqa: E402
from serving.supervisor import ServerSupervisor  # noqa: E402
from serving.server_log import LogTail, Request  # noqa: E402
from fixtures import find_gguf, free_port  # noqa: E402
from serving.probe import canary  # noqa: E402
from tools import default_registry  # noqa: E402

# (channel, kind, text); kind "canary" sends the watchdog's canary instead of a turn.
DAY = [
    ("alpha", "first", "Hello! Who are you?"),
    ("", "canary", ""),
    ("beta", "first", "Hello from another channel."),
    ("", "canary", ""),
    ("alpha", "follow-up", "What is 12 + 7? Reply with only the number."),
    ("", "canary", ""),
    ("beta", "follow-up", "Name one colour."),
]
# --notes: a channel whose system prompt carries its own notes (update_sys), which the
# chatml-function-calling template renders before the tool list.
NOTES = {"gamma": "- The user prefers short answers.\n- The project's files are in src/."}
NOTES_DAY = [("", "canary", ""), ("gamma", "first", "Hello! What do you know about me?")]


class CountingLLM(LLM):
    """The real client, counting its HTTP requests (a turn may re-ask with "none")."""

    sent = 0

    async def _complete(self, params: dict):
        self.sent += 1
        return await super()._complete(params)


@dataclass
class Call:
    label: str
    wall_s: float
    requests: list[Request] = field(default_factory=list)

    @property
    def ttft_s(self) -> float:
        return self.requests[0].prompt.first_token_ms / 1000 if self.requests else float("nan")


async def run_day(config: Config, gguf: Path, tools: list[dict],
                  day: list[tuple[str, str, str]]) -> tuple[list[Call], float]:
    # Only its system prompt is used: the agent's own composition of prompt and notes.
    agent = Agent(config, None, None, None, lambda channel: None,
                  sys_section=lambda channel: NOTES.get(channel, ""))
    supervisor = ServerSupervisor(config, gguf=gguf)
    await supervisor.start(watchdog=False)  # canaries at fixed points, not on a timer
    history: dict[str, list[dict]] = {}
    calls: list[Call] = []
    try:
        log = LogTail(supervisor.log_path)
        async with CountingLLM(config, supervisor) as llm:
            for channel, kind, text in day:
                started, sent_before = time.perf_counter(), llm.sent
                if kind == "canary":
                    ok, why = await canary(config, supervisor.base_url)  # the watchdog's own
                    if not ok:
                        raise RuntimeError(f"the canary failed: {why}")
                else:
                    messages = [{"role": "system", "content": agent.system_prompt(channel)},
                                *history.get(channel, []), {"role": "user", "content": text}]
                    reply = await llm.chat(messages, tools=tools,
                                           max_tokens=config.agent.max_reply_tokens,
                                           temperature=config.agent.temperature)
                    answer: dict = {"role": "assistant", "content": reply.content}
                    if reply.tool_calls:
                        answer["tool_calls"] = reply.tool_calls
                    history[channel] = messages[1:] + [answer]
                wall = time.perf_counter() - started
                label = "canary" if kind == "canary" else f"#{channel} {kind}"
                calls.append(Call(label, wall, await log.requests(max(llm.sent - sent_before, 1))))
        rss = _rss_mib(supervisor.pid)
    finally:
        await supervisor.stop()
    return calls, rss


def _rss_mib(pid: int | None) -> float:
    """The server's resident memory: the model, its KV state and the saved prompt states."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            line = next(row for row in status if row.startswith("VmRSS:"))
    except (OSError, StopIteration, TypeError):
        return float("nan")
    return int(line.split()[1]) / 1024


def report(calls: list[Call]) -> None:
    print(f"  {'call':<18}{'ttft_s':>8}{'total_s':>9}{'prompt':>8}{'reused':>8}"
          f"{'read':>7}  restored")
    for call in calls:
        for i, request in enumerate(call.requests):
            c = request.prompt
            label = call.label if i == 0 else "  + re-ask (none)"
            ttft = f"{c.first_token_ms / 1000:8.2f}"
            total = f"{call.wall_s:9.2f}" if i == 0 else " " * 9
            print(f"  {label:<18}{ttft}{total}{c.prompt_tokens:8d}{c.reused:8d}"
                  f"{c.evaluated:7d}  {'yes' if c.restored else 'no'}")
    turns = {call.label: call for call in calls if call.label != "canary"}
    first, follow = turns["#alpha first"], turns["#alpha follow-up"]
    other = turns["#beta first"]
    fp = follow.requests[0].prompt
    print(f"  follow-up/first: total {follow.wall_s / first.wall_s:.3f}, "
          f"ttft {follow.ttft_s / first.ttft_s:.3f} "
          f"({follow.wall_s:.2f} s / {first.wall_s:.2f} s; ttft {follow.ttft_s:.2f} s / "
          f"{first.ttft_s:.2f} s)")
    print(f"  other channel's first turn: ttft {other.ttft_s:.2f} s, total {other.wall_s:.2f} s "
          f"({other.requests[0].prompt.reused} of {other.requests[0].prompt.prompt_tokens} "
          "prompt tokens reused)")
    if noted := turns.get("#gamma first"):
        gp = noted.requests[0].prompt
        print(f"  first turn in a channel with notes: ttft {noted.ttft_s:.2f} s, total "
              f"{noted.wall_s:.2f} s ({gp.reused} of {gp.prompt_tokens} prompt tokens reused)")
    share = fp.reused / fp.prompt_tokens if fp.prompt_tokens else 0.0
    per_token = fp.prompt_eval_ms / fp.evaluated if fp.evaluated else 0.0
    print(f"  follow-up prompt from the cache: {share:.1%} ({fp.reused}/{fp.prompt_tokens}); "
          f"floor: its {fp.evaluated} new tokens read in {fp.prompt_eval_ms / 1000:.2f} s "
          f"({per_token:.1f} ms/token), first token after {fp.first_token_ms / 1000:.2f} s")
    prompts = [call.requests[0].prompt for call in turns.values() if call.requests]
    hits = sum(p.reused >= 0.9 * p.prompt_tokens for p in prompts)
    print(f"  turn calls that reused >= 90% of their prompt: {hits}/{len(prompts)}")
    every = [r.prompt for call in calls for r in call.requests]
    print(f"  requests that restored a saved state: {sum(p.restored for p in every)}/{len(every)}"
          " (canaries and re-asks included)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", help="the GGUF to serve")
    parser.add_argument("--tools", choices=["default", "all", "both"], default="both")
    parser.add_argument("--prompt-cache-mb", type=int, default=None,
                        help="server.prompt_cache_mb (default: the config's default)")
    parser.add_argument("--notes", action="store_true",
                        help="also a first turn in a channel with its own notes")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="an extra server argument, as server.extra_args (repeatable)")
    args = parser.parse_args()
    gguf = find_gguf(args.gguf)
    with tempfile.TemporaryDirectory(prefix="nightshift-bench-") as tmp:
        server: dict = {"port": free_port(), "extra_args": args.server_arg}
        if args.prompt_cache_mb is not None:
            server["prompt_cache_mb"] = args.prompt_cache_mb
        config = Config.model_validate({"paths": {"data_dir": tmp}, "server": server})
        sets = {"default": _registry(config).schemas(), "all": default_registry().schemas()}
        chosen = ["default", "all"] if args.tools == "both" else [args.tools]
        if len(chosen) == 2 and sets["default"] == sets["all"]:
            chosen = ["all"]  # agent.tools' default is every tool: one run measures both
        print(f"gguf: {gguf.name}, cpus: {os.cpu_count()}, "
              f"load average: {os.getloadavg()[0]:.1f}, "
              f"prompt cache: {config.server.prompt_cache_mb} MiB, "
              f"agent.tools: {config.agent.tools or 'every tool'}, "
              f"extra server args: {config.server.extra_args}")
        for name in chosen:
            print(f"== tools: {name} ({len(sets[name])} tools) ==")
            calls, rss = await run_day(config, gguf, sets[name],
                                       DAY + (NOTES_DAY if args.notes else []))
            report(calls)
            print(f"  server memory after the day: {rss:.0f} MiB resident; "
                  f"load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
