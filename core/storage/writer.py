"""The store's writer process: ``python -m core.storage.writer PATH BUSY_TIMEOUT_MS``.

Started by ``core.storage.group_commit.GroupCommit``, one per open store. It
reads requests, each a frame holding ``(operation name, arguments)``, from
its standard input; takes every request that is waiting (at most
``MAX_BATCH``) and runs them in one transaction (``Batcher``); and answers
the batch with one frame, a list of ``(ok, value)`` in the order asked. Its
first frame says whether its connection opened. It stops at the end of its
input, after answering everything it read.

Its memory (``core.storage.history.HistoryCache``) lives here, beside the
connection whose writes it mirrors.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
from typing import Any

from core.storage.group_commit import (FRAME_HEADER, MAX_BATCH, Batcher, Operation, Result,
                                       frame)
from core.storage.history import HistoryCache
from core.storage.operations import OPERATIONS


class Requests:
    """Frames from a file descriptor: ``batch()`` waits for one, then takes those ready."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()
        self._ended = False

    def batch(self) -> list[tuple[str, tuple]] | None:
        """The requests waiting now (at least one), or None at the end of input."""
        found = self._frames()
        while not found and not self._ended:
            self._fill()
            found = self._frames()
        while len(found) < MAX_BATCH and not self._ended and self._ready():
            self._fill()
            found += self._frames(MAX_BATCH - len(found))
        return found or None

    def _fill(self) -> None:
        data = os.read(self._fd, 1 << 20)
        if data:
            self._buffer += data
        else:
            self._ended = True

    def _ready(self) -> bool:
        return bool(select.select([self._fd], [], [], 0)[0])

    def _frames(self, most: int = MAX_BATCH) -> list[Any]:
        found, at = [], 0
        while len(found) < most and len(self._buffer) - at >= FRAME_HEADER.size:
            (size,) = FRAME_HEADER.unpack_from(self._buffer, at)
            if len(self._buffer) - at - FRAME_HEADER.size < size:
                break
            start = at + FRAME_HEADER.size
            try:
                found.append(pickle.loads(self._buffer[start:start + size]))
            except Exception as exc:  # noqa: BLE001 - its caller hears it; the rest go on
                found.append(("", (exc,)))  # answered in its place, so answers stay in order
            at = start + size
        del self._buffer[:at]
        return found


def bound(name: str, args: tuple, memory: HistoryCache) -> Operation:
    """The request as an operation of the connection; one that cannot be run raises."""
    function = OPERATIONS.get(name)
    if function is None:
        def refused(db: Any) -> None:
            if not name and args and isinstance(args[0], Exception):  # a frame that did not load
                raise ValueError(f"the store's writer could not read a request: {args[0]!r}")
            raise ValueError(f"unknown store operation {name!r}")
        return refused
    return lambda db: function(db, memory, *args)


def _answer(results: list[Result]) -> bytes:
    """The batch's answer; a value or error that does not pickle is said in words."""
    try:
        return frame(results)
    except Exception:  # noqa: BLE001 - one odd value must not lose the others' answers
        kept = []
        for ok, value in results:
            try:
                pickle.dumps(value)
                kept.append((ok, value))
            except Exception as exc:  # noqa: BLE001
                kept.append((False, RuntimeError(f"the store's answer did not pickle: "
                                                 f"{value!r} ({exc})")))
        return frame(kept)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def serve(path: str, busy_timeout_ms: int, fd_in: int, fd_out: int) -> None:
    memory = HistoryCache()
    try:
        batcher = Batcher(path, busy_timeout_ms, on_begin=memory.sync,
                          on_rollback=memory.clear)
    except Exception as exc:  # noqa: BLE001 - told to the bot, which raises it
        _write(fd_out, frame([(False, exc)]))
        return
    _write(fd_out, frame([(True, "ready")]))
    requests = Requests(fd_in)
    try:
        while (batch := requests.batch()) is not None:
            results = batcher.commit([bound(name, args, memory) for name, args in batch])
            _write(fd_out, _answer(results))
    finally:
        batcher.close()


def main() -> None:
    # The bot decides when the writer stops (the end of its input), never a terminal's
    # Ctrl-C; it runs in a session of its own too.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    path, busy_timeout_ms = sys.argv[1], int(sys.argv[2])
    answers = os.dup(sys.stdout.fileno())  # the frames' own descriptor: a stray print
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # (a warning) goes to stderr
    try:
        serve(path, busy_timeout_ms, sys.stdin.fileno(), answers)
    except BrokenPipeError:  # the bot is gone: what was read is committed, nobody to tell
        pass


if __name__ == "__main__":
    main()
