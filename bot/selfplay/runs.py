"""``/selfplay start [ROUNDS] [--solvers N]``, ``/selfplay stop``, and the daily schedule.

``SelfPlay`` is owned by the runtime and given practice's services
(``bot.practice.services``). A run is a background task, so that
``/selfplay stop`` can end it; it answers at once and then says each round's
outcome, and its summary, in the channel it was started from (through the
runtime's announcers: Discord or the console). One run at a time.

- The run is a job row (kind ``selfplay``) whose progress holds the rounds
  done and each round's line; its state ends ``done``, ``cancelled`` (by
  ``/selfplay stop`` or the bot's close) or ``failed``.
- While it runs it is a round in progress (``Rounds``): a due night waits
  for it to end. A run is refused while a night job runs: both would share
  the one model server, and a swap could come mid-round.
- The agent is the practice agent (the runtime's components at
  ``practice.temperature``: a proposer and its solvers must vary to learn
  anything), with the proposer's system-prompt section as a prompt hook of
  that agent only, on its own channel workers.
- ``selfplay.daily`` (a time of day in ``sleep.time_zone``) starts a run of
  ``selfplay.rounds`` rounds once a day, announced in ``sleep.announce_channel``;
  a time that passes while the bot is off is not made up, and a run already
  going (or a night) uses up the day's time: the schedule never queues runs.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from bot.channels import ChannelWorkers
from bot.night.jobs import ACTIVE
from bot.periodic import every
from bot.practice.services import PracticeServices
from bot.selfplay.keep import set_path
from bot.selfplay.round import PROPOSER_SECTION, Outcome, Round, proposer_channel
from core.config.routines import parse_clock

logger = logging.getLogger("nightshift.selfplay")
MAX_ROUNDS, MAX_SOLVERS = 100, 16


class SelfPlay:
    def __init__(self, rt: PracticeServices, clock: Callable[[], datetime] | None = None) -> None:
        self.rt = rt
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self.zone = ZoneInfo(rt.config.sleep.time_zone)
        daily = rt.config.selfplay.daily.strip()
        self.daily = parse_clock(daily) if daily else None
        self.daily_done = self._last_daily() if self.daily else None
        self.task: asyncio.Task | None = None
        self.run_id: int | None = None
        self._loop: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def start(self, rounds: int | None = None, solvers: int | None = None,
                    channel: str = "") -> str:
        """Start a run in the background; the answer says which. Raises ValueError."""
        settings = self.rt.config.selfplay
        rounds = settings.rounds if rounds is None else rounds
        solvers = settings.solvers if solvers is None else solvers
        if not 1 <= rounds <= MAX_ROUNDS:
            raise ValueError(f"ROUNDS must be between 1 and {MAX_ROUNDS}, not {rounds}")
        if not 1 <= solvers <= MAX_SOLVERS:
            raise ValueError(f"--solvers must be between 1 and {MAX_SOLVERS}, not {solvers}")
        if self.running:
            return f"Self-play #{self.run_id} is already running; /selfplay stop ends it."
        if await self.rt.store.jobs("sleep", list(ACTIVE)):
            return "A night is running; self-play would share its model server. Try after it."
        run = await self.rt.store.create_job("selfplay", {
            "rounds": rounds, "solvers": solvers, "target": settings.target,
            "channel": channel})
        self.run_id = run
        self.task = asyncio.create_task(self._run(run, rounds, solvers, channel),
                                        name=f"selfplay #{run}")
        return (f"Self-play #{run} started: {rounds} round(s), {solvers} solver(s) each, "
                f"target mean {settings.target:g}. Proposer channel: {proposer_channel(run)}.")

    async def stop(self) -> str:
        if not self.running:
            return "No self-play is running."
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        return f"Self-play #{self.run_id} stopped; the rounds it finished keep their rewards."

    async def join(self) -> None:
        """Wait for the current run (tests, and the console's end)."""
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)

    async def close(self) -> None:
        for task in (self._loop, self.task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    # -- a run ------------------------------------------------------------------------

    async def _run(self, run: int, rounds: int, solvers: int, channel: str) -> None:
        rt = self.rt
        agent = rt.agent()
        proposer = proposer_channel(run)
        agent.prompt_hooks.append(lambda ch: PROPOSER_SECTION if ch == proposer else "")
        workers = ChannelWorkers(agent.turn, queue_size=max(solvers, 4))
        outcomes: list[Outcome] = []
        state = "failed"
        rt.rounds.add(f"selfplay #{run}")  # a due night waits for the run
        await rt.store.update_job(run, state="running", progress=_progress(outcomes, rounds))
        try:
            for number in range(1, rounds + 1):
                outcome = await Round(rt, workers, run, number, solvers).play()
                outcomes.append(outcome)
                await rt.store.update_job(run, progress=_progress(outcomes, rounds))
                await rt.announce(channel, f"self-play #{run} {outcome.line()}")
            state = "done"
        except asyncio.CancelledError:
            state = "cancelled"
            raise
        except Exception as exc:  # a harness bug: said where the run was started
            logger.exception("self-play #%d failed", run)
            await rt.announce(channel, f"Self-play #{run} failed: {exc}")
        finally:
            rt.rounds.discard(f"selfplay #{run}")
            await workers.close()
            await rt.retire(proposer)  # the run is over: its workspace may be reclaimed
            await rt.store.update_job(run, state=state)
        await rt.announce(channel, _summary(run, outcomes, set_path(rt.config.data_dir)))

    # -- the daily schedule -----------------------------------------------------------

    def start_schedule(self) -> None:
        if self.daily is not None and self._loop is None:
            self._loop = asyncio.create_task(
                every(lambda: self.rt.config.sleep.check_interval_s, self.tick,
                      "self-play schedule check"), name="selfplay-schedule")

    def _last_daily(self) -> datetime:
        """The latest daily time at or before now."""
        assert self.daily is not None
        now = self.clock().astimezone(self.zone)
        moment = now.replace(hour=self.daily.hour, minute=self.daily.minute, second=0,
                             microsecond=0)
        return moment if moment <= now else moment - timedelta(days=1)

    async def tick(self) -> str | None:
        """One check of the schedule; the answer of the run it started, if any."""
        moment = self._last_daily()
        if self.daily_done is not None and moment <= self.daily_done:
            return None
        self.daily_done = moment
        channel = self.rt.config.sleep.announce_channel
        answer = await self.start(channel=channel)
        await self.rt.announce(channel, f"Scheduled self-play ({self.rt.config.selfplay.daily} "
                                        f"{self.rt.config.sleep.time_zone}): {answer}")
        return answer


def _progress(outcomes: list[Outcome], rounds: int) -> dict:
    return {"rounds_done": len(outcomes), "rounds": rounds,
            "valid": sum(o.proposal is not None for o in outcomes),
            "kept": sum(o.kept for o in outcomes), "lines": [o.line() for o in outcomes]}


def _summary(run: int, outcomes: list[Outcome], path) -> str:
    valid = [o for o in outcomes if o.proposal is not None]
    means = [o.mean for o in valid if o.mean is not None]
    proposer = [o.proposer for o in valid if o.proposer is not None]
    mean = f"{statistics.fmean(means):.2f}" if means else "n/a"
    reward = f"{statistics.fmean(proposer):.2f}" if proposer else "n/a"
    kept = sum(o.kept for o in outcomes)
    return (f"Self-play #{run}: {len(outcomes)} round(s), {len(valid)} valid task(s); mean "
            f"solver reward {mean}, mean proposer reward {reward}; {kept} task(s) kept in "
            f"{path}. The next night trains on these turns with their rewards.")
