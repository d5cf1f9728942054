"""Sleep on time, driven by a fake clock: the nightly window, inactivity, waiting for a
running night or a round, a missed night, and the weekly notes cleaning."""

from __future__ import annotations

import asyncio
from datetime import datetime, time, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from bot.night.schedule import Rounds, SleepSchedule, last_weekly, window_start
from bot.runtime import _schedule
from core.config import ConfigError, load_config
from core.config.routines import parse_weekly
from tests.discord_helpers import make_config, start_runtime
from tests.scripted import ScriptedLLM, say

PARIS = ZoneInfo("Europe/Paris")


class FakeClock:
    def __init__(self, when: datetime) -> None:
        self.now = when

    def __call__(self) -> datetime:
        return self.now

    def at(self, day: int, hour: int, minute: int = 0) -> None:
        self.now = datetime(2026, 11, day, hour, minute, tzinfo=PARIS)


@pytest.fixture
async def env(tmp_path: Path):
    """A runtime (scripted model, recorded night launches) and a schedule on a fake clock:
    window 01:00-06:00 Paris time, no idle threshold. Said things land in ``env.said``."""
    rt = await start_runtime(make_config(tmp_path), ScriptedLLM(lambda m, k: say("ok")))
    # Set after the start: the runtime's own schedule (on the real clock) stays off.
    rt.config.sleep.window = "01:00-06:00"
    rt.config.sleep.time_zone = "Europe/Paris"
    rt.config.sleep.announce_channel = "night-owls"
    clock = FakeClock(datetime(2026, 11, 2, 12, 0, tzinfo=PARIS))
    said: list[tuple[str, str]] = []

    async def listen(channel: str, text: str) -> None:
        said.append((channel, text))

    rt.announcers.append(listen)

    def schedule() -> SleepSchedule:
        return _schedule(rt, clock)

    rt.test_clock, rt.said, rt.make_schedule = clock, said, schedule
    yield rt
    await rt.close()


async def test_the_night_starts_once_in_the_window_and_says_why(env):
    schedule = env.make_schedule()
    await env.turn("c1", "hello")
    env.test_clock.at(3, 0, 30)
    assert await schedule.tick() is None and env.night.launched == []
    env.test_clock.at(3, 1, 5)
    assert await schedule.tick() == "it is the nightly window 01:00-06:00 Europe/Paris"
    [job] = await env.store.jobs("sleep")
    assert env.night.launched == [job["id"]] and job["args"]["channel"] == "night-owls"
    assert "the schedule (it is the nightly window" in job["args"]["requested_by"]
    [(channel, text)] = env.said
    assert channel == "night-owls"
    assert text.startswith("Going to sleep because it is the nightly window 01:00-06:00 "
                           "Europe/Paris.\nGoing to sleep: night job #1 over 1 episodes")
    await env.store.update_job(job["id"], state="done")
    await env.turn("c1", "more")
    env.test_clock.at(3, 2, 0)  # the same window: once is enough
    assert await schedule.tick() is None and len(env.night.launched) == 1


async def test_a_due_night_waits_for_a_running_night_and_for_rounds(env):
    schedule = env.make_schedule()
    await env.turn("c1", "hello")
    other = await env.store.create_job("sleep", {"channel": "x"})  # an admin's /sleep
    env.test_clock.at(3, 1, 0)
    assert await schedule.tick() is None and schedule.waiting == "a night job is running"
    await env.store.update_job(other, state="done")
    await env.turn("c1", "after that night")
    with env.rounds.running("practice:arith"):
        env.test_clock.at(3, 1, 10)
        assert await schedule.tick() is None
        assert schedule.waiting == "rounds in progress: practice:arith"
    env.test_clock.at(3, 1, 20)
    assert await schedule.tick() is not None
    assert env.night.launched == [other + 1]


async def test_a_missed_night_makes_the_next_one_take_everything_pending(env):
    schedule = env.make_schedule()
    await env.turn("c1", "day one")
    with env.rounds.running("selfplay:7"):  # busy through the whole first window
        for hour in range(1, 6):
            env.test_clock.at(3, hour, 30)
            assert await schedule.tick() is None
    env.test_clock.at(3, 6, 30)
    assert await schedule.tick() is None and schedule.waiting == ""  # the window is over
    await env.turn("c2", "day two")
    env.test_clock.at(4, 1, 0)
    assert await schedule.tick() is not None
    [job] = await env.store.jobs("sleep")
    assert job["args"]["since"] == 0.0  # no finished night yet: everything
    assert "night job #1 over 2 episodes" in env.said[0][1]


async def test_a_bot_started_after_the_window_waits_for_the_next_one(env):
    await env.turn("c1", "hello")
    env.test_clock.at(3, 7, 0)  # the bot was off all night
    schedule = env.make_schedule()
    assert await schedule.tick() is None
    env.test_clock.at(4, 1, 0)
    assert await schedule.tick() is not None and len(env.night.launched) == 1


async def test_inactivity_starts_a_night_once_per_quiet_spell(env):
    env.config.sleep.window = ""
    env.config.sleep.idle_minutes = 30
    env.test_clock.at(3, 14, 0)
    schedule = env.make_schedule()
    await env.turn("c1", "hello")  # the runtime's handler notes activity on its schedule
    schedule.note_activity()  # this test's schedule is not the runtime's
    env.test_clock.at(3, 14, 29)
    assert await schedule.tick() is None
    env.test_clock.at(3, 14, 30)
    assert await schedule.tick() == "no messages for 30 minutes"
    env.test_clock.at(3, 18, 0)
    assert await schedule.tick() is None and len(env.night.launched) == 1


async def test_nothing_pending_starts_no_night(env):
    schedule = env.make_schedule()
    env.test_clock.at(3, 1, 0)
    assert await schedule.tick() is not None  # due, and handled
    assert env.night.launched == [] and env.said == []
    env.test_clock.at(3, 2, 0)
    assert await schedule.tick() is None


def test_windows_that_cross_midnight_belong_to_the_day_they_start():
    start, end = time(23, 0), time(2, 0)
    day = datetime(2026, 11, 3, 0, 0, tzinfo=PARIS)
    assert window_start(day.replace(hour=23, minute=30), start, end) == day.replace(hour=23)
    assert window_start(day.replace(hour=1, minute=30), start, end) == \
        day.replace(hour=23) - timedelta(days=1)
    assert window_start(day.replace(hour=12), start, end) is None
    assert window_start(day.replace(hour=2), start, end) is None  # the end is not in it


def test_last_weekly_is_the_latest_matching_moment():
    sunday_3 = parse_weekly("sun 03:00")
    monday = datetime(2026, 11, 2, 9, 0, tzinfo=PARIS)  # a Monday
    assert last_weekly(monday, sunday_3) == datetime(2026, 11, 1, 3, 0, tzinfo=PARIS)
    assert last_weekly(datetime(2026, 11, 1, 2, 59, tzinfo=PARIS), sunday_3) == \
        datetime(2026, 10, 25, 3, 0, tzinfo=PARIS)


async def test_the_weekly_notes_cleaning_runs_once_a_week_as_a_round(tmp_path):
    config = make_config(tmp_path)
    config.notes_hygiene.weekly_clean = "sun 03:00"
    clock = FakeClock(datetime(2026, 11, 2, 9, 0, tzinfo=PARIS))  # Monday
    rounds, cleaned, said = Rounds(), [], []

    async def clean() -> str:
        cleaned.append(rounds.names())
        return "done"

    async def nothing() -> int:
        return 0

    async def announce(text: str) -> None:
        said.append(text)

    schedule = SleepSchedule(config, clock=clock, zone=PARIS, rounds=rounds,
                             night_active=lambda: asyncio.sleep(0, False), pending=nothing,
                             start_night=None, announce=announce, clean_notes=clean)
    await schedule.tick()
    assert cleaned == []  # last Sunday's cleaning is before this start: not made up
    clock.at(8, 3, 1)  # the next Sunday
    await schedule.tick()
    await schedule.tick()
    assert cleaned == [["weekly notes cleaning"]] and said == ["Weekly routine cleaning of "
                                                               "notes: done"]
    assert not rounds.busy


async def test_the_schedule_is_an_owned_task_cancelled_on_close(env):
    env.config.sleep.check_interval_s = 0.01
    schedule = env.make_schedule()
    ticks = []
    real_tick = schedule.tick

    async def counted() -> str | None:
        ticks.append(1)
        return await real_tick()

    schedule.tick = counted
    schedule.start()
    task = schedule._task
    for _ in range(100):
        if len(ticks) >= 2:
            break
        await asyncio.sleep(0.01)
    await schedule.close()
    assert len(ticks) >= 2 and task.cancelled()


async def test_the_runtime_starts_its_schedule_only_when_configured(tmp_path):
    config = make_config(tmp_path)
    rt = await start_runtime(config, ScriptedLLM([]))
    assert rt.schedule._task is None
    await rt.close()
    config = make_config(tmp_path)
    config.sleep.idle_minutes = 5
    rt = await start_runtime(config, ScriptedLLM([say("hi")]))
    try:
        task = rt.schedule._task
        assert task is not None and not task.done()
        await rt.turn("c1", "hello")
        assert rt.schedule.last_activity is not None  # messages reset the quiet spell
    finally:
        await rt.close()
    assert task.cancelled()


@pytest.mark.parametrize("line,fix", [
    ('window = "1:00-25:00"', "sleep.window"),
    ('window = "01:00-01:00"', "empty window"),
    ('time_zone = "Mars/Olympus"', "sleep.time_zone"),
])
def test_a_bad_schedule_is_a_config_error_naming_the_key(tmp_path, line, fix):
    path = tmp_path / "config.toml"
    path.write_text(f"[sleep]\n{line}\n")
    with pytest.raises(ConfigError, match=fix):
        load_config(path)
