"""Where the sync tools run: threads of their own, a bounded number, with a deadline.

A sync tool (files, grep, glob, notes, git's bookkeeping) works on the host, in a thread,
because it blocks. It used to run on the event loop's default executor with no time
limit: one call that never returned left its turn, and its episode, open for ever, and a
handful of them took every thread of that executor, so every other ``to_thread`` of the
bot (attachment saving, the sandbox launch, the disk watcher) waited behind them.

Here each call gets a daemon thread (one that never returns cannot hold the process at
exit), at most ``threads`` run at once, and after ``deadline_s`` (waiting included) the
caller gets ``HostCallTimeout`` and its turn goes on. A thread cannot be killed: an
abandoned call keeps running until it really ends, so

- it keeps its slot: stuck calls can fill the slots, never the bot's own executor;
- the next call of the same ``key`` (its channel) waits for it, within its own deadline:
  two calls of one channel never run at once, so a late write and the next change never
  race on the channel's journal, and the late one lands before anything that follows.

No event-loop state is kept: one instance may serve several loops (the tests open one
per test)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class HostCallTimeout(Exception):
    """The call did not finish before its deadline; it may still finish later."""


class HostCalls:
    def __init__(self, threads: int = 8, deadline_s: float = 60.0) -> None:
        self.threads, self.deadline_s = threads, deadline_s
        self._slots = threading.BoundedSemaphore(threads)
        self._guard = threading.Lock()
        self._keys: dict[str, threading.Lock] = {}  # one call of a key at a time

    async def run(self, key: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a thread of its own, within the deadline, after any
        earlier call of ``key`` (a channel) has ended."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        abandoned = threading.Event()
        started = time.monotonic()
        with self._guard:
            turn = self._keys.setdefault(key, threading.Lock())

        def left() -> float:
            return max(0.0, self.deadline_s - (time.monotonic() - started))

        def settle(outcome: str, value: Any) -> None:
            if not future.done():
                future.set_result(value) if outcome == "ok" else future.set_exception(value)

        def work() -> None:
            if not turn.acquire(timeout=left()):
                return  # an earlier call of this key is still running; the caller gave up
            try:
                if not self._slots.acquire(timeout=left()):
                    return
                try:
                    if abandoned.is_set():
                        return
                    try:
                        outcome, value = "ok", fn(*args, **kwargs)
                    except BaseException as exc:  # handed to the caller, whatever it is
                        outcome, value = "error", exc
                    if not abandoned.is_set():
                        try:
                            loop.call_soon_threadsafe(settle, outcome, value)
                        except RuntimeError:  # the loop closed meanwhile: nobody waits
                            pass
                finally:
                    self._slots.release()
            finally:
                turn.release()

        threading.Thread(target=work, name=f"tool {getattr(fn, '__name__', 'call')}",
                         daemon=True).start()
        try:
            done, _ = await asyncio.wait({future}, timeout=self.deadline_s)
        except asyncio.CancelledError:
            abandoned.set()
            raise
        if not done:  # the tool's own TimeoutError, if it raises one, is its result
            abandoned.set()
            raise HostCallTimeout(f"it did not finish within {self.deadline_s:g} s")
        return future.result()
