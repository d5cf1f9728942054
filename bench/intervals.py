"""Before/after figures with an interval: a paired bootstrap over held-out items that
resamples days. Pure Python, seeded, no I/O.

The data are days; a day maps each family to its held-out items' scores, before and
after, item by item (``{family: [(before, after), ...]}``; a score counts as passed when
it is 1.0, as ``bench/learning.py`` counts it). The figure is

    delta_f = mean over days of ( mean over f's items of (after - before) )   (pp)
    mean    = mean over families of delta_f

and its interval comes from ``resamples`` bootstrap replicates, each drawn in two
stages: N days with replacement from the N days, then, inside each drawn day and each
family, that family's items with replacement. An item keeps its before and after
together (paired), so what both sides share (an item every model gets right, or none
does) cancels, and the days' own spread (another practice, other items) is in the
interval too: with one day only the items vary. The interval is the central
``confidence`` share of the replicates (percentile bootstrap).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

Day = dict[str, list[tuple[float, float]]]  # family -> [(before, after)] per item


@dataclass(frozen=True)
class Figure:
    before: float  # % passed before (mean over days)
    after: float  # % passed after
    delta: float  # pp
    lower: float  # pp: the interval's ends
    upper: float
    days: int
    items: int  # items summed over days


def passed(score: float) -> float:
    return 1.0 if score == 1.0 else 0.0


def figure(days: list[Day], families: list[str] | None = None, confidence: float = 0.9,
           resamples: int = 2000, seed: int = 0) -> Figure:
    """The before %, after %, delta (pp) and its interval over ``families`` (all the
    families the days share, by default): one family's row, or the mean row."""
    if not days:
        raise ValueError("no day to measure")
    families = families or sorted(set.intersection(*(set(d) for d in days)))
    if not families or any(not d.get(f) for d in days for f in families):
        raise ValueError(f"every day needs items of every family ({', '.join(families)})")
    point = _stat(days, families)
    before = 100 * _mean([_mean([passed(b) for b, _ in d[f]]) for d in days for f in families])
    rng = random.Random(seed)
    replicates = sorted(_stat(_resample(days, families, rng), families) for _ in range(resamples))
    tail = (1 - confidence) / 2
    lower = replicates[int(tail * (resamples - 1))]
    upper = replicates[int(round((1 - tail) * (resamples - 1)))]
    items = sum(len(d[f]) for d in days for f in families)
    return Figure(before, before + point, point, lower, upper, len(days), items)


def compare(first: dict[str, list[float]], second: dict[str, list[float]],
            families: list[str] | None = None, confidence: float = 0.9,
            resamples: int = 2000, seed: int = 0) -> Figure:
    """Two nights' answers on one kept day's items: ``second`` minus ``first``, paired
    per item (the same held-out items, in the same order), with its interval."""
    families = families or sorted(set(first) & set(second))
    for f in families:
        if len(first[f]) != len(second[f]):
            raise ValueError(f"{f}: {len(first[f])} and {len(second[f])} items; a comparison "
                             "needs the same day's items on both sides")
    return figure([{f: list(zip(first[f], second[f])) for f in families}], families,
                  confidence, resamples, seed)


def _stat(days: list[Day], families: list[str]) -> float:
    return 100 * _mean([_mean([_mean([passed(a) - passed(b) for b, a in d[f]]) for d in days])
                        for f in families])


def _resample(days: list[Day], families: list[str], rng: random.Random) -> list[Day]:
    drawn = [days[rng.randrange(len(days))] for _ in days]
    return [{f: [d[f][rng.randrange(len(d[f]))] for _ in d[f]] for f in families}
            for d in drawn]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
