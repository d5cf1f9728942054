"""Cross-channel leaks: 50 channels each leave a secret in every place a channel owns
(a file, a note, a recipe, its system section, a background job's output, its history in
the store), then every channel looks for the others' secrets through every tool that
lists or searches, and through the context its next turn sends to the model.

A secret is ``leak-RUN-N``: any ``leak-RUN-M`` with M != N seen by channel N is a leak.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

from bench.probes import Tally
from bench.probes.world import call, runtime
from tests.scripted import say

READS = [  # (tool, arguments): everything a channel can use to look around
    ("list_dir", {}), ("tree", {"depth": 5}), ("glob", {"pattern": "**/*"}),
    ("grep", {"pattern": "leak-"}), ("note_list", {}), ("note_search", {"query": "secret leak"}),
    ("list_recipes", {}), ("fill_recipe", {"name": "secret", "values_json": '{"x": "1"}'}),
    ("job_list", {}),
    ("job_poll", {"job_id": "j1"}), ("history", {"limit": 50}), ("health", {}),
    ("update_sys", {"action": "view"}),
]

NO_SECRET_SHOWN = ("job_list", "health")  # they show no content, so not the channel's own either


class Secrets:
    def __init__(self, channels: int) -> None:
        self.run = uuid.uuid4().hex[:8]
        self.channels = [f"room-{i}" for i in range(channels)]
        self.pattern = re.compile(rf"leak-{self.run}-(\d+)")

    def of(self, i: int) -> str:
        return f"leak-{self.run}-{i}"

    def others(self, i: int, text: str) -> set[int]:
        return {int(n) for n in self.pattern.findall(text)} - {i}


async def _plant(rt, s: Secrets, i: int) -> None:
    channel, secret = s.channels[i], s.of(i)
    results = [await call(rt, channel, "write_file", path=f"mine-{secret}.txt",
                              content=f"the {secret}\n"),
               await call(rt, channel, "note_create", title=f"note {secret}", text=f"{secret} secret"),
               await call(rt, channel, "save_recipe", name="secret", template=f"{secret} {{x}}"),
               await call(rt, channel, "update_sys", action="append", text=f"remember {secret}")]
    for _ in range(100):  # the jobs cap (per channel and in total) may ask us to wait
        started = await call(rt, channel, "job_start", code=f"print({secret!r})", timeout_s=30)
        if started.ok:
            break
        await asyncio.sleep(0.2)
    results.append(started)
    for _ in range(300):
        if "running" not in (await call(rt, channel, "job_list")).output:
            break
        await asyncio.sleep(0.1)
    await rt.turn(channel, f"please keep {secret} to yourself")
    bad = [r.output[:120] for r in results if not r.ok]
    if bad:
        raise RuntimeError(f"planting in {channel} failed: {bad}")


async def _look(tally: Tally, rt, s: Secrets, i: int) -> None:
    channel = s.channels[i]
    for name, arguments in READS:
        result = await call(rt, channel, name, **arguments)
        own = s.of(i) in result.output or name in NO_SECRET_SHOWN
        tally.check(f"{channel} {name}: only its own secret", own and not s.others(i, result.output),
                    f"ok={result.ok} own={own} others={sorted(s.others(i, result.output))[:5]}: "
                    f"{result.output[:160]!r}")
    question = f"what do you remember, {channel}?"  # picks this turn's calls out of all channels'
    await rt.turn(channel, question)
    sent = "\n".join(str(m.get("content")) for messages, _ in rt.llm.calls
                     if _last_user(messages) == question for m in messages)
    tally.check(f"{channel} model context: its history and section, nobody else's",
                s.of(i) in sent and not s.others(i, sent), sorted(s.others(i, sent))[:5])


def _last_user(messages: list[dict]) -> str:
    return next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")


async def run(tally: Tally, work: Path, quick: bool) -> None:
    s = Secrets(10 if quick else 50)
    async with runtime(work, lambda messages, kwargs: say("noted")) as rt:
        # One channel after another: on 2 cores running them at once took longer, and the
        # per-channel workers, contexts and stores are what is under test, not the scheduler.
        for i in range(len(s.channels)):
            await _plant(rt, s, i)
        for i in range(len(s.channels)):
            await _look(tally, rt, s, i)
        stored = await rt.store.episodes_since(0)
        tally.check("every planting turn and looking turn was stored",
                    len(stored) == 2 * len(s.channels), len(stored))
    tally.notes.append(f"{len(s.channels)} channels x {len(READS) + 1} looks")
