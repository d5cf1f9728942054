"""Where the sync tools run: threads of their own, a bounded number, with a deadline.

A sync tool (files, grep, glob, notes, git's bookkeeping) works on the host, in a thread,
because it blocks. It used to run on the event loop's default executor with no time
limit: one call that never returned left its turn, and its episode, open for ever, and a
handful of them took every thread of that executor, so every other ``to_thread`` of the
bot (attachment saving, the sandbox launch, the disk watcher) waited behind them.

Here each call gets a daemon thread (one that never returns cannot hold the process at
exit), at most ``threads`` run at once, and after ``deadline_s`` (waiting for a slot
included) the caller gets ``HostCallTimeout`` and its turn goes on. A thread cannot be
killed: an abandoned call keeps its slot until it really ends, so stuck calls can fill
the slots, never the bot's own executor. Pure Python, no event-loop state: one
instance may serve several loops (the tests open one per test)."""

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
    def __init__(self, threads: int = 4, deadline_s: float = 60.0) -> None:
        self.threads, self.deadline_s = threads, deadline_s
        self._slots = threading.BoundedSemaphore(threads)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a thread of its own, within the deadline."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        abandoned = threading.Event()
        started = time.monotonic()

        def settle(outcome: str, value: Any) -> None:
            if future.done():
                return
            if outcome == "ok":
                future.set_result(value)
            else:
                future.set_exception(value)

        def work() -> None:
            left = self.deadline_s - (time.monotonic() - started)
            if not self._slots.acquire(timeout=max(0.0, left)):
                return  # the caller has given up already
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
                    except RuntimeError:  # the loop closed meanwhile: nobody is waiting
                        pass
            finally:
                self._slots.release()

        threading.Thread(target=work, name=f"tool {getattr(fn, '__name__', 'call')}",
                         daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.deadline_s)
        except TimeoutError:
            abandoned.set()
            raise HostCallTimeout(f"it did not finish within {self.deadline_s:g} s") from None
        except asyncio.CancelledError:
            abandoned.set()
            raise
