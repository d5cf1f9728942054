"""kill -9 during logging: a process writes trajectories to the real SQLite store (one
task per channel, ``tests/store_writer.py``) and is SIGKILLed at a random moment, again
and again on the same file. After each kill the store must open (replaying the WAL), pass
``integrity_check``, hold no episode with a gap in its steps, and hold every step the
writer acknowledged before it died. Then the bot's own store opens the file and logs on.
"""

from __future__ import annotations

import random
from pathlib import Path

from bench.probes import Tally
from core.storage.store import Step, Store
from tests.store_writer import crash_once


async def run(tally: Tally, work: Path, quick: bool) -> None:
    kills = 10 if quick else 60
    db = work / "nightshift.db"
    rng = random.Random(11)
    acked = 0
    for i in range(kills):
        result = await crash_once(db, rng.uniform(0.02, 0.4), channels=3, seed=i)
        acked += result.acked
        tally.check(f"kill {i + 1}: the store opens and passes integrity_check",
                    result.integrity == "ok", result.integrity)
        tally.check(f"kill {i + 1}: no episode has a gap", result.gaps == 0, f"{result.gaps} gaps")
        tally.check(f"kill {i + 1}: every acknowledged step is on disk ({result.acked})",
                    result.lost == 0 and result.acked > 0, f"{result.lost} lost of {result.acked}")
    async with await Store.open(db) as store:
        episode = await store.start_episode("after-the-kills", model_version="bench")
        await store.add_step(episode, Step(role="user", content="still logging"))
        steps = await store.channel_history("after-the-kills", 10)
    tally.check("after the kills the store logs a new episode", len(steps) == 1, steps)
    tally.notes.append(f"{kills} SIGKILLs, {acked} acknowledged steps checked")
