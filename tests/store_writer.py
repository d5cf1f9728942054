"""Crash the store on purpose: a writer process to SIGKILL, and the check after.

Run as a script, it opens the store, starts one episode per channel and adds
steps from one asyncio task per channel until it is killed, printing
``ack EPISODE SEQ`` (flushed) after each ``add_step`` returns. Every line the
parent reads is therefore a step the store acknowledged, and must be on disk.

``crash_once`` is the parent side, shared by tests/test_store.py and
bench/store.py: start the writer, let it ack for ``delay`` seconds, SIGKILL
it, then reopen the file and count what went wrong.

    python tests/store_writer.py DB_PATH [--channels N] [--seed S]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from core.storage.store import Step, Store  # noqa: E402

WRITER = Path(__file__).resolve()


def _step(channel: str, n: int, rng: random.Random) -> Step:
    # Sizes vary from a line to several pages so that kills land inside
    # multi-page WAL writes too, not only inside one-page commits.
    text = f"{channel} step {n} " + "x" * rng.choice((0, 50, 900, 6000))
    if n % 3 == 2:
        return Step(role="tool", content=text, tool_call_id=f"call_{n}", name="read_file")
    call = {"name": "read_file", "arguments": '{"path": "a.txt"}'}
    return Step(
        role="assistant",
        content=text,
        tool_calls=[{"id": f"call_{n + 1}", "type": "function", "function": call}],
        prompt_tokens=n,
        completion_tokens=1,
        meta={"n": n},
    )


async def _write_forever(db_path: str, channels: int, seed: int) -> None:
    rng = random.Random(seed)
    store = await Store.open(db_path)

    async def one_channel(channel: str) -> None:
        episode_id = await store.start_episode(channel, model_version="crash-test")
        n = 0
        while True:
            stored = await store.add_step(episode_id, _step(channel, n, rng))
            sys.stdout.write(f"ack {episode_id} {stored.seq}\n")
            sys.stdout.flush()
            n += 1

    await asyncio.gather(*(one_channel(f"crash-{seed}-{i}") for i in range(channels)))


@dataclass
class CrashResult:
    acked: int  # steps acknowledged before the kill
    integrity: str  # "ok", or what integrity_check reported
    gaps: int  # episodes (in the whole file) whose seqs are not 0..n-1
    lost: int  # acknowledged steps missing after the kill


async def crash_once(db_path: Path, delay: float, channels: int = 3, seed: int = 0) -> CrashResult:
    """Kill a writer ``delay`` seconds after its first ack; check the file."""
    argv = [str(WRITER), str(db_path), "--channels", str(channels), "--seed", str(seed)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    acked: dict[int, set[int]] = defaultdict(set)

    async def read_acks() -> None:
        async for line in proc.stdout:
            _, episode, seq = line.split()
            acked[int(episode)].add(int(seq))

    reader = asyncio.create_task(read_acks())
    try:
        async with asyncio.timeout(30):
            while not acked and not reader.done():
                await asyncio.sleep(0.005)
        if reader.done():
            raise RuntimeError(f"writer exited early: {(await proc.stderr.read()).decode()}")
        await asyncio.sleep(delay)
    finally:
        proc.kill()  # SIGKILL: no atexit, no flush, no close
        await proc.wait()
        await reader  # lines already in the pipe were acknowledged too
    return await _check(db_path, acked)


async def _check(db_path: Path, acked: dict[int, set[int]]) -> CrashResult:
    async with await Store.open(db_path) as store:  # opening replays the WAL
        integrity = await store.integrity_check()
    db = sqlite3.connect(db_path)
    try:
        # UNIQUE (episode_id, seq) rules out duplicates, so count and range
        # are enough to see a gap in any episode of the file.
        gaps = db.execute(
            "SELECT COUNT(*) FROM (SELECT episode_id FROM steps GROUP BY episode_id "
            "HAVING MIN(seq) != 0 OR MAX(seq) != COUNT(*) - 1)"
        ).fetchone()[0]
        lost = 0
        for episode_id, seqs in acked.items():
            rows = db.execute("SELECT seq FROM steps WHERE episode_id = ?", (episode_id,))
            stored = {seq for (seq,) in rows}
            lost += len(seqs - stored)
    finally:
        db.close()
    return CrashResult(sum(map(len, acked.values())), integrity, gaps, lost)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db_path")
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(_write_forever(args.db_path, args.channels, args.seed))


if __name__ == "__main__":
    main()
