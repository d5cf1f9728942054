"""The events the day writes and the night reads: one name for each kind, defined here
once and used by writer and reader alike, and the payload of a check's reward, the one
event whose fields the night's rewards rest on (``trainer.rewards`` reads it).

An event is something that happened in a channel but is not a message: a check's
result, a stray end-of-turn, a repeated call, a compaction, a reply sent on Discord,
a night report sent, a release gone live. Its payload is JSON in the ``events`` table."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Event(StrEnum):
    VERIFIER_REWARD = "verifier_reward"  # a check's result for an episode: ``CheckResult``
    STRAY_END_OF_TURN = "stray_end_of_turn"  # {"step_id", ...}: the night penalises its token
    TEMPLATE_SYNTAX = "template_syntax"  # a reply written in the chat template's syntax
    REPEATED_CALL = "repeated_call"  # the same call again with the same arguments
    COMPACTION = "compaction"  # older messages replaced by a summary
    SELFPLAY = "selfplay"  # a self-play round's step: who, which round, which task
    DISCORD_REPLY = "discord_reply"  # {"message_id", ...}: a reply's Discord message
    NIGHT_REPORT = "night_report"  # {"job_id"}: the report was sent
    RELEASE_LIVE = "release_live"  # {"release_id", ...}: a release went live


@dataclass(frozen=True)
class CheckResult:
    """What a practice run or self-play stores for one attempt (``Event.VERIFIER_REWARD``).

    ``reward`` is in [0, 1] (1 = passed), or None when the check could not judge the
    attempt (``error`` says why): the night then leaves the episode unjudged, never
    scored by accident. ``group`` is shared by the attempts at one task in one run:
    their mean is each one's baseline. ``check`` names the check ("exact", "regex",
    "python:FILE", ...; ``REFERENCE`` for a demonstration). ``extra`` is for people
    reading the store (the set, the self-play role and round); the night ignores it."""

    check: str
    reward: float | None
    task: str = ""
    group: str = ""
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        data = {**self.extra, "check": self.check, "reward": self.reward, "task": self.task,
                "task_id": self.task, "group": self.group}
        if self.reward is None:
            data.update(error=self.error, why=self.error)
        return data


REFERENCE = "reference"  # the check of a demonstration: a practice task's reference answer
