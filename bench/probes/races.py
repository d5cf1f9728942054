"""A real background job swaps folders for links while the bot works on its workspace.

The attack of issue 40 part 1: a job started with ``job_start`` (the real bwrap sandbox,
the sandbox's uid) exchanges ``scratch/`` and folders inside it with symlinks that lead,
on the host, to a canary folder beside the data dir (``renameat2(RENAME_EXCHANGE)`` in a
tight loop: atomic, so every host-side operation meets a link at a random moment). Meanwhile
the bot's own host-side operations run against that workspace, many times each:

- ``Workspace.clear_scratch`` (the end of a turn): must remove nothing of the canary;
- ``usage_bytes`` (the quota): must not count the canary's 24 MiB file;
- git_add's size walk (``tools.git._too_big``): must not report the canary's 120 MiB
  sparse file;
- ``hand_over`` (before each sandboxed run): must not chown the canary.

The canary is checked from outside after each operation: every file there, with its
content and owner. The job's own count of swaps is printed, so a run where the job never
raced is not mistaken for one that held.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

from bench.probes import Tally
from bench.probes.world import call, runtime
from sandbox.bwrap import hand_over, setup_user
from sandbox.shared_limits import usage_bytes
from tools.git import _too_big

CHANNEL = "racer"
CANARY_MIB = 24
JOB = """\
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
TARGET = {target!r}
def exchange(a, b):
    return libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) == 0
def fill():
    for name in ("keep", "models", "nested/keep"):  # named like the canary's folders
        os.makedirs(os.path.join("scratch", name), exist_ok=True)
        with open(os.path.join("scratch", name, "f.txt"), "w") as f:
            f.write("x")
    for link, target in (("evil", TARGET), ("scratch/evil", "../" + TARGET)):
        if not os.path.lexists(link):
            os.symlink(target, link)
swaps, until = 0, time.time() + {seconds}
while time.time() < until:
    try:
        fill()
    except OSError:
        pass
    for _ in range(200):
        swaps += exchange("scratch", "evil") + exchange("scratch/keep", "scratch/evil")
    with open("swaps.txt", "w") as f:
        f.write(str(swaps))
"""


def plant_canary(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Folders named like the job's, a file that counts in a walk, one git_add refuses."""
    for name in ("keep", "models", "nested/keep"):
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "f.txt").write_text("canary")
    with open(folder / "models" / "weights.bin", "wb") as f:
        f.write(os.urandom(1 << 20) * CANARY_MIB)  # allocated: a walk that enters counts it
    with open(folder / "keep" / "huge.bin", "wb") as f:
        f.truncate(120 << 20)  # over git_add's limit, sparse
    return snapshot(folder)


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    found = {}
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        head = path.read_bytes()[:64] if path.is_file() else b""
        found[str(path.relative_to(folder))] = (head, info.st_uid)
    return found


async def run(tally: Tally, work: Path, quick: bool) -> None:
    rounds = 15 if quick else 60
    async with runtime(work) as rt:
        ctx = rt.spaces.context(CHANNEL)
        root = ctx.workspace.root
        canary = root.parents[2] / "canary"  # beside the data dir, as its own folders are
        before = plant_canary(canary)
        target = os.path.relpath(canary, root)
        uid, gid = setup_user()
        started = await call(rt, CHANNEL, "job_start", timeout_s=600,
                             code=JOB.format(target=target, seconds=3600))
        tally.check("the racing job started", "started job" in started.output, started.output)
        job_id = re.search(r"started job (\S+)", started.output)
        await asyncio.sleep(2.0)
        operations = {
            "clear_scratch": lambda: ctx.workspace.clear_scratch(),
            "usage_bytes": lambda: usage_bytes(root),
            "git_add's size walk": lambda: _too_big(root, ["scratch", "evil"]),
            "hand_over": lambda: hand_over(root, uid, gid),
        }
        try:
            for name, operation in operations.items():
                touched, worst = 0, None
                for _ in range(rounds):
                    try:
                        got = await asyncio.to_thread(operation)
                    except OSError as exc:  # refused is fine; harming the host is not
                        got = exc
                    harmed = snapshot(canary) != before
                    if name == "usage_bytes" and isinstance(got, int):
                        worst = max(worst or 0, got)
                        harmed |= got >= CANARY_MIB << 20
                    if name == "git_add's size walk" and isinstance(got, list):
                        harmed |= any("huge.bin" in p for p in got)
                    touched += harmed
                    await asyncio.sleep(0.01)
                detail = f"{rounds} rounds" + (f", largest usage {worst >> 10} KiB"
                                                if worst is not None else "")
                tally.check(f"{name} raced by a swapping job: 0 host paths touched",
                            touched == 0, f"{touched} of {rounds} rounds touched the canary; "
                            f"{detail}")
        finally:
            if job_id:
                await call(rt, CHANNEL, "job_stop", job_id=job_id.group(1).rstrip(";"))
        swaps_file = root / "swaps.txt"
        swaps = int(swaps_file.read_text() or 0) if swaps_file.exists() else 0
        tally.check("the job really raced (swaps counted)", swaps > 0, f"{swaps} swaps")
        tally.notes.append(f"the racing job made {swaps} swaps during "
                           f"{rounds * len(operations)} host-side operations")
        tally.check("the canary is whole at the end", snapshot(canary) == before,
                    json.dumps(sorted(set(snapshot(canary)) ^ set(before)))[:300])
