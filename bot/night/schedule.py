"""Sleep on time: start the night in a daily window or after a quiet spell.

``SleepSchedule`` is a background task owned by the runtime. Every
``sleep.check_interval_s`` it asks ``tick()`` whether a night is due:

- the **window** (``sleep.window`` in ``sleep.time_zone``): once per window,
  the first check inside it; a window that crosses midnight belongs to the
  day it starts;
- **inactivity** (``sleep.idle_minutes``): no message for that long, and some
  message since the last night started.

A due night still waits while a night job runs, or while any round is in
progress (``Rounds``: practice, self-play, swarm and routine-cleaning rounds
register there), and starts when they end, if the window is still open. A
window that passes while the bot is off or busy is not made up: the night
job takes every episode since the last *finished* night (``admin.sleep``), so
the next night processes everything pending. Nothing pending, no night.

The same loop runs the optional weekly routine cleaning of notes.

Everything the schedule acts on is injected (the clock too, so tests drive
it with a fake one); it imports nothing of the runtime or the front ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, time, timedelta, tzinfo
from typing import TYPE_CHECKING

from bot.periodic import every
from core.config.routines import Weekly, parse_weekly, parse_window

if TYPE_CHECKING:
    from core.config import Config

logger = logging.getLogger("nightshift.schedule")
Clock = Callable[[], datetime]  # an aware datetime


class Rounds:
    """The rounds in progress, by name; the night waits until there are none.

    A practice or self-play runner wraps each round in ``with rounds.running(name):``.
    """

    def __init__(self) -> None:
        self._names: dict[str, int] = {}

    @contextmanager
    def running(self, name: str) -> Iterator[None]:
        self.add(name)
        try:
            yield
        finally:
            self.discard(name)

    def add(self, name: str) -> None:
        self._names[name] = self._names.get(name, 0) + 1

    def discard(self, name: str) -> None:
        left = self._names.get(name, 0) - 1
        if left > 0:
            self._names[name] = left
        else:
            self._names.pop(name, None)

    @property
    def busy(self) -> bool:
        return bool(self._names)

    def names(self) -> list[str]:
        return sorted(self._names)


def window_start(now: datetime, start: time, end: time) -> datetime | None:
    """The start of the window that contains ``now`` (in now's zone), or None."""
    today = now.replace(hour=start.hour, minute=start.minute, second=0, microsecond=0)
    clock = now.time().replace(tzinfo=None)
    if start < end:
        return today if start <= clock < end else None
    if clock >= start:  # the window crosses midnight: its evening part
        return today
    if clock < end:  # its morning part belongs to yesterday's window
        return today - timedelta(days=1)
    return None


def last_weekly(now: datetime, weekly: Weekly) -> datetime:
    """The latest moment at or before ``now`` that matches ``weekly``."""
    moment = now.replace(hour=weekly.at.hour, minute=weekly.at.minute, second=0, microsecond=0)
    moment -= timedelta(days=(now.weekday() - weekly.weekday) % 7)
    return moment if moment <= now else moment - timedelta(days=7)


class SleepSchedule:
    """Decides when to sleep; ``tick`` does one check, the loop repeats it."""

    def __init__(self, config: Config, *, clock: Clock, zone: tzinfo, rounds: Rounds,
                 night_active: Callable[[], Awaitable[bool]],
                 pending: Callable[[], Awaitable[int]],
                 start_night: Callable[[str], Awaitable[str]],
                 announce: Callable[[str], Awaitable[None]],
                 clean_notes: Callable[[], Awaitable[str]] | None = None) -> None:
        self.window = parse_window(config.sleep.window)
        self.spec = f"{config.sleep.window} {config.sleep.time_zone}"
        self.idle = (timedelta(minutes=config.sleep.idle_minutes)
                     if config.sleep.idle_minutes else None)
        self.weekly = parse_weekly(config.notes_hygiene.weekly_clean)
        self.interval_s = config.sleep.check_interval_s
        self.clock, self.zone, self.rounds = clock, zone, rounds
        self.night_active, self.pending = night_active, pending
        self.start_night, self.announce, self.clean_notes = start_night, announce, clean_notes
        now = self.now()
        self.last_activity: datetime | None = None
        self.last_sleep: datetime = now  # what came before this start waits for a due night
        self.window_done: datetime | None = None
        self.notes_done = last_weekly(now, self.weekly) if self.weekly else None
        self.waiting = ""  # why a due night waits, said once
        self._task: asyncio.Task | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.window or self.idle or self.weekly)

    def now(self) -> datetime:
        return self.clock().astimezone(self.zone)

    def note_activity(self) -> None:
        """A message arrived: the quiet spell starts again."""
        self.last_activity = self.now()

    # -- the check ---------------------------------------------------------------

    def due(self, now: datetime) -> str | None:
        """Why a night is due now, or None."""
        if self.window:
            start = window_start(now, *self.window)
            if start is not None and start != self.window_done:
                return f"it is the nightly window {self.spec}"
        if self.idle and self.last_activity and self.last_activity >= self.last_sleep \
                and now - self.last_activity >= self.idle:
            return f"no messages for {int(self.idle.total_seconds() // 60)} minutes"
        return None

    async def tick(self) -> str | None:
        """One check; returns the reason when a night was started (or found nothing to do)."""
        now = self.now()
        await self._weekly_notes(now)
        reason = self.due(now)
        if reason is None:
            self.waiting = ""
            return None
        blocker = await self._blocker()
        if blocker:
            if blocker != self.waiting:
                self.waiting = blocker
                logger.info("a night is due (%s) but waits: %s", reason, blocker)
            return None
        self.waiting = ""
        self._mark(now)
        if not await self.pending():
            logger.info("a night is due (%s), but nothing is pending since the last one", reason)
            return reason
        text = await self.start_night(reason)
        await self.announce(f"Going to sleep because {reason}.\n{text}")
        return reason

    async def _blocker(self) -> str:
        if await self.night_active():
            return "a night job is running"
        if self.rounds.busy:
            return "rounds in progress: " + ", ".join(self.rounds.names())
        return ""

    def _mark(self, now: datetime) -> None:
        self.last_sleep = now
        if self.window and (start := window_start(now, *self.window)) is not None:
            self.window_done = start

    async def _weekly_notes(self, now: datetime) -> None:
        if not self.weekly or self.clean_notes is None:
            return
        moment = last_weekly(now, self.weekly)
        if self.notes_done is not None and moment <= self.notes_done:
            return
        self.notes_done = moment
        with self.rounds.running("weekly notes cleaning"):  # a night waits for it
            text = await self.clean_notes()
        await self.announce(f"Weekly routine cleaning of notes: {text}")

    # -- the loop ----------------------------------------------------------------

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.create_task(
                every(lambda: self.interval_s, self.tick, "sleep schedule check"),
                name="sleep-schedule")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
