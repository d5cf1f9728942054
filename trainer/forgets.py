"""A night honours ``/forget``s made while it runs.

A night collects its episodes at the start, then judges and trains for hours; an
episode may be forgotten meanwhile (``core.storage.forgetting``). So:

- right before training, the night asks the store which of the episodes its rows carry
  (each row's ``sources``: ``core.storage.copies``) have been forgotten since it
  collected them, and rewrites its dataset without their rows (``drop_forgotten``).
  The episodes it then trains on are kept in the job's progress and in its release's
  meta (``trained_episodes``);
- once it has trained, an episode forgotten after the training used it cannot be taken
  out of the weights: the night asks again before its export and before it records its
  release, and refuses the release (``ForgottenAfterTraining``, the job fails saying
  which episodes and why); ``/promote`` asks once more (``serving.releases``), so a
  candidate recorded before such a forget is never served.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from core.storage.copies import row_sources, scrub_dataset
from core.storage.store import Store


class ForgottenAfterTraining(Exception):
    """Episodes the night trained on were forgotten since: its release is refused."""

    def __init__(self, episodes: set[int], when: str) -> None:
        ids = ", ".join(f"#{i}" for i in sorted(episodes))
        super().__init__(f"episode(s) {ids} were forgotten after this night trained on them "
                         f"(found {when}); the weights hold what they learnt from them, so "
                         "this night's release is refused and never served")
        self.episodes = set(episodes)


def _sources(dataset: Path) -> set[int]:
    found: set[int] = set()
    if not dataset.is_file():  # nothing to train on: the training says so
        return found
    with dataset.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                found |= row_sources(json.loads(line))
    return found


async def drop_forgotten(store: Store, dataset: Path) -> tuple[set[int], set[int], int]:
    """Rewrite ``dataset`` without the rows of episodes forgotten since it was written:
    (the episodes its rows still carry, those forgotten, rows dropped)."""
    sources = await asyncio.to_thread(_sources, dataset)
    forgotten = await store.forgotten_among(sources)
    if not forgotten:
        return sources, forgotten, 0
    dropped = await asyncio.to_thread(scrub_dataset, dataset, forgotten)
    # A row that carried a forgotten episode went whole, with the others it carried.
    return await asyncio.to_thread(_sources, dataset), forgotten, dropped


async def refuse_if_forgotten(store: Store, trained: list[int], when: str) -> None:
    """Raise ``ForgottenAfterTraining`` when an episode the night trained on is forgotten."""
    forgotten = await store.forgotten_among(trained)
    if forgotten:
        raise ForgottenAfterTraining(forgotten, when)
