"""Disk that nothing bounded (issue 40, part 3), against the real runtime: attachments
against a small workspace quota, the undo journal's, the image cache's and the notes'
growth against their bounds, and the data folder against its budget, measured on disk
after every write, through every kind of write (tool writes, attachments, cached images,
new workspaces for threads and DMs, a program's output), with one person's threads and DMs
under their share. Judged practice workspaces are reclaimed past the kept ones, and a link
a job planted is removed as a link: a host canary survives.

A running program is stopped at the disk watch's poll where as much again as its growth
since the last poll would pass a bound (``sandbox.disk_budget``), and what it wrote stays.
That is not exact: a poll that comes late (a loaded CPU) lets it pass the bound by what it
wrote meanwhile. The overshoot is reported as a figure and checked against a loose bound.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
from pathlib import Path

from bench.probes import Tally
from bench.probes.world import call, runtime
from bot.discord_front.render import save_attachments
from bot.disk.workspaces import SpaceRefused
from sandbox.disk_budget import measure
from sandbox.shared_limits import usage_bytes
from tools.image_cache import RECENT_S, ImageCache

MIB = 2**20


class Attachment:
    def __init__(self, filename: str, data: bytes) -> None:
        self.filename, self._data, self.size = filename, data, len(data)

    async def read(self) -> bytes:
        return self._data


def png(seed: int, side: int = 150) -> bytes:
    from PIL import Image

    pixels = random.Random(seed).randbytes(side * side * 3)  # noise: PNG cannot shrink it
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), pixels).save(out, "PNG")
    return out.getvalue()


async def _attachments(tally: Tally, work: Path) -> None:
    async with runtime(work / "attachments", sandbox__workspace_quota_mb=10) as rt:
        ctx = rt.spaces.context("uploads")
        quota = rt.config.sandbox.workspace_quota_mb << 20
        notes = []
        for n in range(5):  # five messages, each with a 6 MiB file
            notes += await save_attachments([Attachment(f"big{n}.bin", os.urandom(6 * MIB))],
                                            ctx.workspace, quota_bytes=quota,
                                            disk=ctx.services.disk, channel="uploads")
        used = usage_bytes(ctx.workspace.root)
        tally.check("5 large attachments into a 10 MiB workspace stay under its quota",
                    used <= quota, f"{used / MIB:.1f} MiB; {notes}")
        tally.check("the ones that do not fit are refused with a note saying why",
                    sum("quota" in n for n in notes if n.startswith("[not saved")) == 4, notes)


async def _journal(tally: Tally, work: Path, runs: int) -> None:
    async with runtime(work / "journal", sandbox__workspace_quota_mb=8) as rt:
        ctx = rt.spaces.context("undo")
        blobs, quota = ctx.journal.dir / "blobs", 8 * MIB
        worst = 0
        for n in range(runs):  # every run rewrites a 3 MiB file: 3 MiB more to undo each time
            code = f"import os\nopen('data.bin','wb').write(os.urandom(3 << 20))\nprint({n})"
            result = await call(rt, "undo", "run_python", code=code)
            if not result.ok:
                tally.check(f"journal run {n} ran", False, result.output[:200])
                return
            worst = max(worst, usage_bytes(blobs))
        # History is trimmed to the quota; the newest entry (its before and after) stays.
        tally.check(f"the undo copies of {runs} runs stay within the quota and the newest entry",
                    worst <= quota + 2 * 3 * MIB + MIB, f"{worst / MIB:.1f} MiB at most")
        undo = await call(rt, "undo", "undo")
        tally.check("the newest run can still be undone", undo.ok, undo.output[:200])


async def _images(tally: Tally, work: Path, views: int) -> None:
    async with runtime(work / "images", model__vision=False) as rt:
        clock = [1e9]
        bound = MIB
        cache = ImageCache(rt.config.data_dir / "images", bound, rt.spaces.services.disk,
                           clock=lambda: clock[0])
        rt.spaces.services.image_cache = cache  # before any context copies the services
        ctx = rt.spaces.context("viewer")
        for n in range(views):
            (ctx.workspace.root / f"p{n}.png").write_bytes(png(n))
        worst, refused = 0, []
        for n in range(views):
            result = await call(rt, "viewer", "view_image", path=f"p{n}.png")
            refused += [] if result.ok else [result.output]
            worst = max(worst, measure(cache.folder))
            clock[0] += RECENT_S / 4  # a few views a minute
        tally.check(f"{views} viewed images: the cache never passes its bound",
                    worst <= bound + 64 * 1024, f"{worst / 1024:.0f} KiB of {bound / 1024:.0f}")
        tally.check("the views past its room are refused only while every image is recent",
                    all("image cache is full" in r for r in refused),
                    f"{len(refused)} refused: {refused[:1]}")
        tally.check("old images made room for new ones", len(refused) < views // 2,
                    f"{len(refused)} of {views} refused")


async def _notes(tally: Tally, work: Path) -> None:
    import tools.notes

    cap, tools.notes.MAX_NOTES = tools.notes.MAX_NOTES, 4  # a small cap, as the real one acts
    try:
        async with runtime(work / "notes") as rt:
            results = [await call(rt, "notes", "note_create", title=f"n{n}", text=f"fact {n}")
                       for n in range(6)]
            stored = rt.spaces.services.notes.count("notes", include_shared=False)
            tally.check("a channel's notes stop at the cap, with a message saying so",
                        stored == 4 and all("the most kept" in r.output for r in results[4:]),
                        f"{stored} stored; {results[-1].output[:160]}")
    finally:
        tools.notes.MAX_NOTES = cap


async def _budget(tally: Tally, work: Path, rounds: int) -> None:
    fields = {"disk__budget_mb": 40, "disk__user_share_percent": 40,
              "disk__channel_share_percent": 30, "disk__max_workspaces": 8,
              "sandbox__workspace_quota_mb": 64}
    async with runtime(work / "budget", **fields) as rt:
        disk = rt.spaces.services.disk
        rng = random.Random(7)
        owners = {"general": None, "dm-1": "user-1", "t1": "user-1", "t2": "user-1",
                  "t3": "user-1", "dm-2": "user-2", "t4": "user-2"}
        refused = {"write": 0, "attachment": 0, "workspace": 0}
        for n in range(rounds):
            channel = rng.choice(sorted(owners))
            try:
                ctx = rt.spaces.context(channel, owner=owners[channel])
            except SpaceRefused as exc:
                refused["workspace"] += 1
                tally.check(f"round {n}: a refused workspace says why", "disk" in str(exc),
                            exc)
                continue
            if rng.random() < 0.5:
                size = rng.randint(1, 3) * MIB // 2
                result = await call(rt, channel, "write_file", path=f"f{n}.txt",
                                    content="x" * size)
                refused["write"] += not result.ok
                detail = result.output[:160]
            else:
                notes = await save_attachments([Attachment(f"a{n}.bin", os.urandom(2 * MIB))],
                                               ctx.workspace, disk=disk, channel=channel)
                refused["attachment"] += notes[0].startswith("[not saved")
                detail = notes[0][:160]
            measured = await asyncio.to_thread(disk.refresh)
            tally.check(f"round {n} ({channel}): the data folder stays under its budget",
                        measured <= disk.budget, f"{measured / MIB:.2f} MiB: {detail}")
            mine = disk.owner_used("user-1")
            tally.check(f"round {n}: user-1's channels stay under their share",
                        mine <= disk.user_share, f"{mine / MIB:.2f} MiB")
        tally.check("the budget was reached: writes and attachments were refused",
                    refused["write"] + refused["attachment"] > 0, refused)
        await _new_workspaces(tally, rt)
        await _program(tally, rt, disk)
        tally.notes.append(f"budget: {rounds} rounds of writes, refused {refused}")


async def _new_workspaces(tally: Tally, rt) -> None:
    """New people's threads until the count bound: each past it refused, none made."""
    answers = []
    for k in range(4):
        try:
            rt.spaces.context(f"thread-{k}", owner=f"user-{10 + k}")
            answers.append("made")
        except SpaceRefused as exc:
            answers.append(str(exc))
    folders = len(list((rt.config.data_dir / "workspaces").iterdir()))
    tally.check("new workspaces stop at disk.max_workspaces, saying so",
                folders <= rt.config.disk.max_workspaces
                and all("disk.max_workspaces" in a for a in answers if a != "made"),
                f"{folders} folders; {answers}")


async def _program(tally: Tally, rt, disk) -> None:
    """A program writing fast into a nearly full folder: stopped before the first bound
    it nears (the channel's share here), its files kept, and a second run stopped too."""
    ctx = rt.spaces.context("general")
    for name in list(ctx.workspace.root.iterdir()):  # make room: deleting is never refused
        if name.is_file():
            await call(rt, "general", "delete", path=name.name)
    before = await asyncio.to_thread(disk.refresh)
    code = ("import os\nfor i in range(400):\n    open(f'p{i}.bin','wb').write(os.urandom(1<<20))"
            "\nprint('all written')")
    result = await call(rt, "general", "run_python", code=code, timeout_s=60)
    after = await asyncio.to_thread(disk.refresh)
    over = max(after - disk.budget, disk.usage("general").channel - disk.channel_share, 0)
    tally.notes.append(f"program: {before / MIB:.1f} MiB before, {after / MIB:.1f} MiB after, "
                       f"{over / MIB:.1f} MiB past its bound")
    said = ("disk is full", "used its share")
    tally.check("a program writing past its bound is stopped, saying why",
                "all written" not in result.output and any(s in result.output for s in said),
                result.output[-300:])
    tally.check("its overshoot is a late poll's writes at most (loose bound: 16 MiB)",
                over <= 16 * MIB, f"{over / MIB:.1f} MiB past it")
    again = await call(rt, "general", "run_python", code=code, timeout_s=60)
    over = max(await asyncio.to_thread(disk.refresh) - disk.budget,
               disk.usage("general").channel - disk.channel_share, 0)
    tally.check("a second run is stopped too (loose bound: 16 MiB)",
                "all written" not in again.output and any(s in again.output for s in said)
                and over <= 16 * MIB, f"{over / MIB:.1f} MiB past; {again.output[-160:]}")


async def _reclaim(tally: Tally, work: Path, attempts: int) -> None:
    canary = work / "host-canary"
    (canary / "keep").mkdir(parents=True)
    (canary / "keep" / "precious.txt").write_text("host")
    async with runtime(work / "reclaim", disk__keep_practice_workspaces=2,
                       disk__refresh_s=0.1) as rt:
        for k in range(attempts):
            channel = f"practice-probe-task-1-{k}"
            ctx = rt.spaces.context(channel)
            ctx.workspace.resolve("answer.txt").write_text("42")
            os.symlink(canary, ctx.workspace.root / "escape")
            await rt.spaces.retire(channel)
        folder = rt.config.data_dir / "workspaces"
        for _ in range(100):  # the background watch reclaims them, in a thread
            left = [p for p in folder.iterdir() if p.name.startswith("practice-")]
            if len(left) <= 2:
                break
            await asyncio.sleep(0.1)
        tally.check(f"{attempts} judged practice workspaces: the newest 2 are kept",
                    len(left) == 2, [p.name for p in left])
        tally.check("a link a job planted was removed as a link: the host canary survives",
                    (canary / "keep" / "precious.txt").read_text() == "host")


async def run(tally: Tally, work: Path, quick: bool) -> None:
    await _attachments(tally, work)
    await _journal(tally, work, 6 if quick else 15)
    await _images(tally, work, 24 if quick else 60)
    await _notes(tally, work)
    await _budget(tally, work, 20 if quick else 60)
    await _reclaim(tally, work, 6 if quick else 20)
