"""The cache of viewed images (tools.image_cache): bounded in size, the least recently
viewed entry goes first, an entry a turn may still read never goes, and a full data
folder refuses a new image without removing anything."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import pytest

from sandbox.disk_budget import DiskBudget, DiskFull
from sandbox.paths import Workspace
from tools import ToolContext, default_registry
from tools.image_cache import RECENT_S, ImageCache

KIB = 1024


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def image(n: int, size: int = 40 * KIB) -> bytes:
    """The same bytes for the same ``n``: viewing it again is a hit."""
    return n.to_bytes(4, "big") + random.Random(n).randbytes(size - 4)


def names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if not p.name.startswith(".")}


def test_past_its_size_the_least_recently_viewed_image_goes_first(tmp_path):
    clock = Clock()
    cache = ImageCache(tmp_path / "images", max_bytes=120 * KIB, clock=clock)
    digests = []
    for n in range(3):
        digests.append(cache.put(image(n), ".png")[0])
        clock.now += 2 * RECENT_S
    cache.put(image(0), ".png")  # the first is viewed again: now the newest
    clock.now += 2 * RECENT_S
    new, path = cache.put(image(3), ".png")
    kept = names(tmp_path / "images")
    assert f"{digests[1]}.png" not in kept  # the least recently viewed went
    assert {f"{digests[0]}.png", f"{digests[2]}.png", f"{new}.png"} == kept
    assert cache.used() <= 120 * KIB and path.read_bytes()[:4] == (3).to_bytes(4, "big")


def test_an_image_a_turn_may_still_read_is_never_evicted(tmp_path):
    """view_image's file is read by the agent loop right after it returns: an entry
    viewed in the last RECENT_S stays, and the new image is refused instead."""
    clock = Clock()
    cache = ImageCache(tmp_path / "images", max_bytes=100 * KIB, clock=clock)
    _, first = cache.put(image(1), ".png")
    clock.now += 1
    _, second = cache.put(image(2), ".png")
    with pytest.raises(DiskFull, match="image cache is full .* viewed in the last few minutes"):
        cache.put(image(3), ".png")
    assert first.is_file() and second.is_file()
    clock.now += RECENT_S + 1
    cache.put(image(3), ".png")  # now the oldest may go
    assert not first.exists() and second.is_file()


def test_the_index_is_rebuilt_from_the_folder_after_a_restart(tmp_path):
    clock = Clock()
    ImageCache(tmp_path / "images", max_bytes=100 * KIB, clock=clock).put(image(1), ".png")
    os.utime(next((tmp_path / "images").iterdir()), (clock.now - 2 * RECENT_S,) * 2)
    again = ImageCache(tmp_path / "images", max_bytes=100 * KIB, clock=clock)
    assert again.used() > 0
    again.put(image(2), ".png")
    again.put(image(3), ".png")  # the one from before the restart is the oldest: it goes
    assert len(names(tmp_path / "images")) == 2 and again.used() <= 100 * KIB


def test_an_image_larger_than_the_whole_cache_is_refused(tmp_path):
    cache = ImageCache(tmp_path / "images", max_bytes=16 * KIB)
    with pytest.raises(DiskFull, match="more than the whole image cache"):
        cache.put(image(1, 20 * KIB), ".png")
    assert names(tmp_path / "images") == set()


def test_new_images_count_in_the_data_folders_budget_and_a_full_one_refuses(tmp_path):
    data = tmp_path / "data"
    (data / "store").mkdir(parents=True)
    (data / "store" / "db").write_bytes(os.urandom(200 * KIB))
    budget = DiskBudget(data, 300 * KIB)
    budget.refresh()
    cache = ImageCache(data / "images", max_bytes=10 * 2**20, disk=budget)
    cache.put(image(1), ".png")
    assert budget.total() >= 240 * KIB
    with pytest.raises(DiskFull, match="disk is full"):
        for n in range(2, 10):
            cache.put(image(n), ".png")
    assert budget.total() <= 300 * KIB
    assert budget.refresh() <= 300 * KIB  # measured on disk, not just counted


def png(width: int, height: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.frombytes("RGB", (width, height), os.urandom(width * height * 3)).save(out, "PNG")
    return out.getvalue()


async def test_view_image_keeps_the_cache_under_its_bound(tmp_path):
    cache = ImageCache(tmp_path / "images", max_bytes=200 * KIB)
    ctx = ToolContext.open("viewer", Workspace(tmp_path / "ws"), tmp_path / "state",
                           image_cache=cache)
    registry = default_registry()
    for n in range(6):
        (ctx.workspace.root / f"p{n}.png").write_bytes(png(100, 100))  # ~30 KiB each
    results = [await registry.call("view_image", {"path": f"p{n}.png"}, ctx) for n in range(6)]
    assert all(r.ok for r in results[:5]), [r.output for r in results]
    assert cache.used() <= 200 * KIB
    cached = [Path(r.meta["image"]["cache_path"]) for r in results if r.ok]
    assert all(path.is_file() for path in cached)  # all recent: none was evicted


def test_entries_removed_behind_its_back_free_their_room(tmp_path):
    """A /forget may delete a cached image: a full-looking cache counts again first."""
    cache = ImageCache(tmp_path / "images", max_bytes=100 * KIB, clock=Clock())
    _, first = cache.put(image(1), ".png")
    cache.put(image(2), ".png")
    first.unlink()
    cache.put(image(3), ".png")  # all recent, yet it fits: the deleted one is not counted
    assert cache.used() <= 100 * KIB and len(names(tmp_path / "images")) == 2


def test_discard_removes_one_image_and_gives_its_room_back(tmp_path):
    data = tmp_path / "data"
    budget = DiskBudget(data, 10 * 2**20)
    budget.refresh()
    cache = ImageCache(data / "images", max_bytes=2**20, disk=budget)
    kept, _ = cache.put(image(1), ".png")
    gone, _ = cache.put(image(2), ".png")
    before = (cache.used(), budget.total())
    assert cache.discard(f"{gone}.png") and not cache.discard(f"{gone}.png")
    assert names(data / "images") == {f"{kept}.png"}
    assert cache.used() == before[0] - 40 * KIB and budget.total() <= before[1] - 40 * KIB
    with pytest.raises(ValueError, match="not a cached image"):
        cache.discard("../store.db")
