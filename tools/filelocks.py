"""Per-file locks for a workspace that several channels share (a swarm's shared workspace).

Each channel's turns run one at a time, but two channels of a swarm that share a
workspace run concurrently, and an edit is a read-modify-write: without a lock,
two edits of one file would silently drop one of them. ``locked(ctx, path)``
holds the lock of one resolved path for the span of a tool's change; other
files stay free. Without a ``file_locks`` service (tests, tools used alone) it
locks nothing.

Locks are threading locks: the registry runs file tools in worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class FileLocks:
    """One lock per path, made on first use."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[Path, threading.Lock] = {}

    def lock(self, path: Path) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(Path(path), threading.Lock())


@contextmanager
def locked(ctx: Any, path: Path) -> Iterator[None]:
    locks = ctx.services.file_locks
    if locks is None:
        yield
        return
    with locks.lock(path):
        yield
