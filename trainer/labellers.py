"""Each person's share of a night: how many episodes one person's labels may decide.

A person's ✅ or ❌ outranks the judge (``trainer.rewards``), and the author of an
episode may label it. Without a bound, one person who chats a lot and labels every
reply would set the rewards of a whole night. So each night counts, per person, the
episodes whose reward their label decides (in the order the episodes started), and
past ``night.labels_per_person`` it sets that person's labels aside: those episodes
fall back to the next standing label, else a check or the judge, as if unlabelled.

Exempt: labels with no giver (an admin's ``/label`` command) and the givers listed in
``discord.admin_user_ids``. An admin known only by a role id counts as a person here:
the night does not see Discord's roles.

The night report shows who labelled what (``night.labellers``): per giver, the
episodes their labels decided (accepted, rejected) and the ones set aside.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from core.storage.schema import Episode
from trainer.rewards import PERSON_REWARDS


def deciding_giver(episode: Episode) -> tuple[str, int | None] | None:
    """The label that gives the episode its person reward and who gave it, or None.

    The latest standing label among PERSON_REWARDS wins, as ``person_reward`` reads it."""
    givers = episode.labellers or [None] * len(episode.labels)
    for label, giver in zip(reversed(episode.labels), reversed(givers)):
        if label in PERSON_REWARDS:
            return label, giver
    return None


def cap_labels(episodes: Iterable[Episode], per_person: int,
               trusted: Iterable[int] = ()) -> dict[str, dict[str, int]]:
    """Set aside, in place, each person's labels past ``per_person`` decided episodes.

    Returns per giver (as a string: JSON keys) ``{accepted, rejected, set_aside}``,
    the givers exempt included, so the report shows every label that counted."""
    trusted = set(trusted)
    decided: Counter = Counter()
    report: dict[str, dict[str, int]] = {}
    for episode in episodes:
        while (found := deciding_giver(episode)) is not None:
            label, giver = found
            key = "admin command" if giver is None else str(giver)
            entry = report.setdefault(key, {"accepted": 0, "rejected": 0, "set_aside": 0})
            exempt = giver is None or giver in trusted
            if exempt or decided[giver] < per_person:
                decided[giver] += 0 if exempt else 1
                entry["rejected" if PERSON_REWARDS[label] < 0 else "accepted"] += 1
                break
            entry["set_aside"] += 1
            _drop_giver(episode, giver)  # the next standing label, if any, may decide it
    return report


def _drop_giver(episode: Episode, giver: int) -> None:
    givers = episode.labellers or [None] * len(episode.labels)
    kept = [(label, who) for label, who in zip(episode.labels, givers) if who != giver]
    episode.labels = [label for label, _ in kept]
    episode.labellers = [who for _, who in kept]

