"""Host-side work that grows with its input, and calls that never return (issue 40 part 2).

Through the real runtime's registry and tools, with the event loop's stalls measured the
whole time (a task that wakes every 5 ms and records how late it woke):

- ``glob`` with 40 ``**`` parts, and 32 parts of ``**/a*``, on a 10-deep tree: linear, so
  seconds at most where the old definition was exponential;
- ``save_recipe`` with a format-spec width (``{x:>100000000}``) or a conversion: refused,
  and the bot's peak memory does not grow;
- a sync tool that never returns: its caller gets an error after the deadline, six of them
  at once leave another channel's tool call and the bot's own ``to_thread`` working;
- the day's growth: ``strip_reasoning`` over 20 history steps of 60,000 characters full
  of tags, and the sleep schedule's episode count over 5,000 episodes.

Target: no tool call holds its caller past its deadline, and the loop never stalls 100 ms.
"""

from __future__ import annotations

import asyncio
import resource
import threading
import time
from pathlib import Path

from bench.probes import Tally
from bench.probes.world import call, runtime
from bot.agent.messages import strip_reasoning
from tools import ToolContext, tool

CHANNEL = "hard"
RELEASE = threading.Event()
DEADLINE_S = 1.0  # the probe's deadline for host calls (the bot's is 60 s): the same code


@tool
def stall(ctx: ToolContext) -> str:
    """Never return (until the probe ends): a tool stuck in a system call."""
    RELEASE.wait(120)
    return "late"


class LoopLag:
    """The longest time the event loop was late to wake a 5 ms sleeper."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task | None = None

    async def _watch(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.005)
            self.worst = max(self.worst, time.perf_counter() - before - 0.005)

    def __enter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._watch())
        return self

    def __exit__(self, *exc) -> None:
        self._task.cancel()


def deep_tree(root: Path, depth: int = 10) -> None:
    folder = root / "tree"
    for level in range(depth):
        folder = folder / f"a{level}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"x{level}.txt").write_text("x")
        (folder.parent / f"b{level}").mkdir(exist_ok=True)


async def timed(coro) -> tuple[object, float]:
    start = time.perf_counter()
    result = await coro
    return result, time.perf_counter() - start


async def _globs(tally: Tally, rt) -> None:
    deep_tree(rt.spaces.context(CHANNEL).workspace.root)
    for pattern in ("/".join(["**"] * 40) + "/x*.txt", "/".join(["**/a*"] * 16)):
        result, seconds = await timed(call(rt, CHANNEL, "glob", pattern=pattern))
        tally.check(f"glob {pattern[:24]}... ({pattern.count('/') + 1} parts) in "
                    f"{seconds:.2f} s (<= 5 s)", seconds <= 5.0, result.output[:200])


async def _recipes(tally: Tally, rt) -> None:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for template in ("{x:>100000000}", "{x!r}", "{x.__class__}", "{x[0]}"):
        saved = await call(rt, CHANNEL, "save_recipe", name="bomb", template=template)
        filled = await call(rt, CHANNEL, "fill_recipe", name="bomb", values_json='{"x": "a"}')
        tally.check(f"save_recipe refuses {template}", not saved.ok and not filled.ok,
                    saved.output[:200])
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    tally.check(f"recipes grew the bot's peak memory by {grown:.0f} MiB (< 50)", grown < 50)


async def _stuck(tally: Tally, rt) -> None:
    rt.registry.register(stall)
    rt.registry.host.deadline_s = DEADLINE_S
    try:
        calls = [call(rt, f"stuck-{i}", "stall") for i in range(6)]
        results, seconds = await timed(asyncio.gather(*calls))
        tally.check(f"six stuck calls gave their callers an error in {seconds:.1f} s "
                    f"(deadline {DEADLINE_S:g} s)", seconds <= DEADLINE_S + 1.0
                    and all(not r.ok and r.meta.get("error") == "deadline" for r in results),
                    results[0].output[:200])
        other, seconds = await timed(call(rt, "elsewhere", "list_dir", path="."))
        tally.check(f"another channel's tool call with six stuck: {seconds:.2f} s",
                    other.ok and seconds < DEADLINE_S, other.output[:200])
        own, seconds = await timed(asyncio.to_thread(lambda: "free"))
        tally.check(f"the bot's own to_thread with six stuck: {seconds * 1000:.0f} ms",
                    own == "free" and seconds < 0.5)
    finally:
        RELEASE.set()


async def _growth(tally: Tally, rt) -> None:
    text = ("<think>" + "y" * 50 + "</think> kept " + "<think>" * 3) * 600
    start = time.perf_counter()
    for _ in range(20):
        strip_reasoning(text * 2)
    seconds = time.perf_counter() - start
    tally.check(f"strip_reasoning over 20 steps of {len(text) * 2:,} characters: "
                f"{seconds * 1000:.1f} ms (< 50)", seconds < 0.05)
    store = rt.store
    for i in range(5000):
        await store.start_episode(f"busy-{i % 50}")
    count, seconds = await timed(store.count_episodes_since(0.0))
    tally.check(f"counting {count} episodes for the schedule: {seconds * 1000:.0f} ms (< 100)",
                count >= 5000 and seconds < 0.1)


async def run(tally: Tally, work: Path, quick: bool) -> None:
    async with runtime(work) as rt:
        with LoopLag() as lag:
            for part in (_globs, _recipes, _stuck, _growth):
                await part(tally, rt)
        tally.check(f"the event loop's longest stall: {lag.worst * 1000:.0f} ms (< 100)",
                    lag.worst < 0.1)
