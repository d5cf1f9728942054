"""Config sections for what the bot does on its own: sleep on time, notes hygiene, swarms.

The time specs are parsed here, once, so a typo stops the start with the key
named (``sleep.window = "1:00-6"`` ...), and the scheduler
(``bot.night.schedule``) gets ready-made values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field, field_validator, model_validator

from core.config.sections import _Section

_CLOCK = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")


def parse_clock(text: str) -> time:
    match = _CLOCK.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a time of day like 01:30")
    return time(int(match.group(1)), int(match.group(2)))


def parse_window(text: str) -> tuple[time, time] | None:
    """``"01:00-06:00"`` as (start, end); "" as None. A window may cross midnight."""
    if not text.strip():
        return None
    parts = text.split("-")
    if len(parts) != 2:
        raise ValueError(f"{text!r} is not a window like 01:00-06:00")
    start, end = parse_clock(parts[0]), parse_clock(parts[1])
    if start == end:
        raise ValueError(f"{text!r} is an empty window: start and end are equal")
    return start, end


@dataclass(frozen=True)
class Weekly:
    weekday: int  # Monday = 0, as datetime.weekday()
    at: time


def parse_weekly(text: str) -> Weekly | None:
    """``"sun 03:00"`` as Weekly(6, 03:00); "" as None."""
    if not text.strip():
        return None
    parts = text.lower().split()
    if len(parts) != 2 or parts[0][:3] not in DAYS:
        raise ValueError(f"{text!r} is not a day and time like sun 03:00")
    return Weekly(DAYS.index(parts[0][:3]), parse_clock(parts[1]))


class SleepConfig(_Section):
    window: str = Field(
        "", description='a daily window like "01:00-06:00" (may cross midnight), or "" for none'
    )
    time_zone: str = Field("UTC", description="an IANA time zone name, e.g. Europe/Paris")
    idle_minutes: int = Field(
        0, ge=0, description="minutes without messages before the bot sleeps; 0 = never"
    )
    announce_channel: str = Field(
        "", description='the channel key (a Discord channel id) to announce sleep in; "" = console'
    )
    check_interval_s: float = Field(60, gt=0, description="seconds between checks (> 0)")

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        parse_window(value)
        return value

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{value!r} is not a known time zone") from None
        return value


class NotesHygieneConfig(_Section):
    weekly_clean: str = Field(
        "", description='a day and time like "sun 03:00" (in sleep.time_zone), or "" for never'
    )
    duplicate_similarity: float = Field(
        0.9, gt=0, le=1, description="a cosine similarity in (0, 1], e.g. 0.9"
    )

    @field_validator("weekly_clean")
    @classmethod
    def _weekly(cls, value: str) -> str:
        parse_weekly(value)
        return value


class Swarm(BaseModel):
    name: str = Field(description="a name of letters, digits, _ or - (1-40 characters)")
    channels: list[str] = Field(min_length=2, description="two or more channel keys")
    shared_workspace: bool = Field(False, description="true to share one workspace")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r} must be 1-40 letters, digits, _ or -")
        return value


class SwarmsConfig(_Section):
    teams: list[Swarm] = Field(
        default_factory=list,
        description='a list like [{name = "team", channels = ["1", "2"], shared_workspace = false}]',
    )

    @model_validator(mode="after")
    def _one_swarm_per_channel(self) -> SwarmsConfig:
        names = [s.name for s in self.teams]
        if len(names) != len(set(names)):
            raise ValueError("two swarms have the same name")
        seen: dict[str, str] = {}
        for swarm in self.teams:
            for channel in swarm.channels:
                if channel in seen:
                    raise ValueError(f"channel {channel!r} is in the swarms {seen[channel]!r} and "
                                     f"{swarm.name!r}; a channel may be in one swarm only")
                seen[channel] = swarm.name
        return self


class SelfplayConfig(_Section):
    target: float = Field(
        0.5, ge=0, le=1, description="the solvers' mean reward the proposer aims for (0..1)"
    )
    solvers: int = Field(4, ge=1, le=16, description="solver attempts per task by default (1..16)")
    rounds: int = Field(
        1, ge=1, le=100, description="rounds per /selfplay start by default (1..100)"
    )
    max_tries: int = Field(
        3, ge=1, le=10, description="proposals a round may try before it gives up (1..10)"
    )
    pass_reward: float = Field(
        1.0, gt=0, le=1, description="the least reward the reference answer must get (0 < x <= 1)"
    )
    keep_band: float = Field(
        0.5, ge=0, le=1, description="how far from the target a kept task's mean may be (0..1)"
    )
    daily: str = Field(
        "", description='a time of day like "14:00" (in sleep.time_zone) to run self-play, or ""'
    )

    @field_validator("daily")
    @classmethod
    def _daily(cls, value: str) -> str:
        if value.strip():
            parse_clock(value)
        return value
