"""The cache of viewed images: content-addressed, read-only, bounded in size.

``view_image`` copies every image it shows to ``<sha256><ext>`` here (``tools.media``),
so that the step records exactly the pixels the agent saw. Nothing removed them: the
cache grew with every image ever viewed. ``ImageCache`` holds at most
``disk.image_cache_mb``, and past that it removes the least recently viewed entries first.

Why a size budget with LRU eviction, and not a charge to each channel's share: an entry
is named by its content, so two channels that view one image share one file; charging it
to either would be arbitrary, and removing it on one channel's account would take it from
the other. And a cache is the one thing in the data folder that may be dropped: the step
that viewed an image keeps its hash, size and shape, and what an evicted entry loses is
the pixels, which the night does not read. New entries still count in the data folder's
budget, as the bot's own writes (``DiskBudget.claim``); when that is full, a new image is
refused with the budget's message.

What an open turn needs of the cache: with vision, the agent loop reads the cached file
right after ``view_image`` returns, to attach it (``bot.agent.loop``); from then on the
turn carries the pixels in its messages. So an entry viewed in the last ``RECENT_S``
seconds (ten minutes, against the one store write between the two) is never evicted, and
when only such entries are left, the new image is refused (``DiskFull``) rather than
taking one a turn may still read.

Recency is each file's mtime, set again at every view (the owner may ``utime`` a
read-only file). The index of entries is read from the folder once, in the tool's thread
(tools run off the event loop), then kept in memory under a lock, and read again when
the cache looks full (something else, a /forget, may have removed entries).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sandbox.disk_budget import DiskBudget, DiskFull, blocks, size_text

RECENT_S = 600.0


def cache_image(cache_dir: Path, data: bytes, extension: str) -> tuple[str, Path]:
    """Store ``data`` as ``<sha256><extension>`` in the cache, read-only; returns (hash, path).

    An existing entry is never rewritten: equal names mean equal bytes. Two
    writers racing on one name both os.replace identical bytes, so either
    wins harmlessly.
    """
    digest = hashlib.sha256(data).hexdigest()
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"{digest}{extension}"
    if target.exists():
        return digest, target
    tmp = cache_dir / f".{digest}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # training reads it nights later; make it survive a crash
        os.chmod(tmp, 0o444)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return digest, target


class ImageCache:
    """One cache folder for every channel; ``max_bytes`` None means unbounded."""

    def __init__(self, folder: Path, max_bytes: int | None = None,
                 disk: DiskBudget | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.folder = Path(folder)
        self.max_bytes, self.disk, self.clock = max_bytes, disk, clock
        self._lock = threading.Lock()
        self._index: dict[str, tuple[float, int]] | None = None  # name -> (last view, bytes)

    def used(self) -> int:
        with self._lock:
            return sum(size for _, size in self._entries().values())

    def put(self, data: bytes, extension: str) -> tuple[str, Path]:
        """Keep ``data`` (or mark it viewed again); returns (hash, path). DiskFull when
        it cannot fit without removing an image a turn may still need, or when the data
        folder's budget is full."""
        digest = hashlib.sha256(data).hexdigest()
        name, size = f"{digest}{extension}", blocks(len(data))
        target = self.folder / name
        with self._lock:
            index = self._entries()
            if name in index and target.exists():
                now = self.clock()
                os.utime(target, (now, now))
                index[name] = (now, index[name][1])
                return digest, target
            if sum(s for _, s in index.values()) + size > (self.max_bytes or size):
                self._index = None  # full: count again what is really there (a /forget
                index = self._entries()  # may have removed entries behind the index)
            self._make_room(index, size)
            if self.disk is not None:
                self.disk.claim(target, size)  # the bot's own write: no channel's share
            digest, target = cache_image(self.folder, data, extension)
            now = self.clock()
            os.utime(target, (now, now))  # the file's mtime is the index's truth on a rescan
            index[name] = (now, size)
            return digest, target

    def discard(self, name: str) -> bool:
        """Remove one cached image (``/forget``), keeping the index and the budget's count
        right; whether it was there. Only a plain name inside the cache is accepted."""
        if Path(name).name != name or name.startswith("."):
            raise ValueError(f"{name!r} is not a cached image's name")
        path = self.folder / name
        with self._lock:
            index = self._entries()
            try:
                size = path.lstat().st_blocks * 512
                path.unlink()
            except FileNotFoundError:
                index.pop(name, None)
                return False
            index.pop(name, None)
            if self.disk is not None:
                self.disk.release(path, size)
            return True

    def _entries(self) -> dict[str, tuple[float, int]]:
        if self._index is None:
            self._index = {}
            self.folder.mkdir(parents=True, exist_ok=True)
            for entry in os.scandir(self.folder):
                if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                    continue  # a writer's temporary file, or not ours
                info = entry.stat(follow_symlinks=False)
                self._index[entry.name] = (info.st_mtime, info.st_blocks * 512)
        return self._index

    def _make_room(self, index: dict[str, tuple[float, int]], size: int) -> None:
        """Remove the least recently viewed entries until ``size`` more bytes fit."""
        if self.max_bytes is None:
            return
        if size > self.max_bytes:
            raise DiskFull(f"this image takes {size_text(size)}, more than the whole image "
                           f"cache ({size_text(self.max_bytes)}, disk.image_cache_mb)")
        used = sum(s for _, s in index.values())
        recent = self.clock() - RECENT_S
        for name, (seen, bytes_) in sorted(index.items(), key=lambda kv: kv[1][0]):
            if used + size <= self.max_bytes or seen > recent:
                break
            path = self.folder / name
            path.unlink(missing_ok=True)
            del index[name]
            used -= bytes_
            if self.disk is not None:
                self.disk.release(path, bytes_)
        if used + size > self.max_bytes:
            raise DiskFull(f"the image cache is full ({size_text(used)} of "
                           f"{size_text(self.max_bytes)}, disk.image_cache_mb) with images "
                           "viewed in the last few minutes; try again later")
