"""How many optimizer steps a night takes and which sequences each one sees.

``steps`` when set; else ``epochs`` passes over the data, but never fewer than
``min_steps``: a day's data is often one batch, and 1-3 Adam steps a night change
nothing. A small night is not repeated past ``max_epochs`` passes to reach ``min_steps``:
its batches shrink instead (``plan``). Each epoch is a fresh seeded shuffle, and the
remainder batch's loss weighs its size over the batch size."""

from __future__ import annotations

import random
from collections.abc import Iterator

from trainer.settings import Settings


def batches(n: int, settings: Settings, processes: int = 1) -> Iterator[tuple[list[int], float]]:
    """(indices, loss weight): seeded shuffles of the examples, cut into batches, epoch
    after epoch. The remainder batch weighs its size over the batch size; one too small
    to give every process a sequence joins the batch before it (weight 1)."""
    rng = random.Random(settings.seed)
    while True:
        order = list(range(n))
        rng.shuffle(order)
        starts = list(range(0, n, settings.batch))
        if len(starts) > 1 and n - starts[-1] < processes:
            starts.pop()
        for start, stop in zip(starts, [*starts[1:], n]):
            size = stop - start
            weight = size / settings.batch if len(starts) > 1 and size < settings.batch else 1.0
            yield order[start:stop], weight


def batches_per_epoch(n: int, batch: int, processes: int) -> int:
    full, rest = divmod(n, batch)
    return full + (1 if rest and (rest >= processes or not full) else 0)


def planned_steps(n: int, settings: Settings, processes: int = 1) -> int:
    """Optimizer steps for n sequences: ``steps``, else max(epochs' batches, min_steps)."""
    if settings.steps:
        return settings.steps
    return max(settings.epochs * batches_per_epoch(n, settings.batch, processes),
               settings.min_steps)


def plan(n: int, settings: Settings, processes: int = 1) -> tuple[int, int]:
    """(steps, batch) for n sequences: ``planned_steps`` at ``batch``, unless reaching
    min_steps would take more than ``max_epochs`` passes (``epochs`` asks for); then a
    smaller batch that gives min_steps steps within them, and with batches of one
    sequence, as many steps as the passes allow."""
    steps = planned_steps(n, settings, processes)
    passes = max(settings.epochs, settings.max_epochs)
    if settings.steps or steps * settings.batch <= passes * n \
            or settings.epochs * batches_per_epoch(n, settings.batch, processes) >= steps:
        return steps, settings.batch
    batch = min(settings.batch, max(processes, passes * n // settings.min_steps))
    return min(settings.min_steps, passes * batches_per_epoch(n, batch, processes)), batch
