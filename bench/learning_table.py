"""bench/learning.py's figures as markdown, ready to paste: the command line, the date,
the machine's training tokens/s, then per family and for the mean the before %, after %,
delta and its 90% interval (``intervals``: a paired bootstrap over the held-out items,
resampling days)."""

from __future__ import annotations

import os
import platform
import shlex
import time

from intervals import Day, Figure, compare, figure


def days_of(results: list[dict]) -> list[Day]:
    """Each day's items as (before, after) pairs; a day whose night made no candidate has
    no "after" and is left out (the caller says so)."""
    days = []
    for result in results:
        before, after = result["before"], result.get("after") or {}
        if before and set(before) <= set(after):
            days.append({f: list(zip(before[f], after[f])) for f in before})
    return days


def header(argv: list[str], tokens_per_s: list[float]) -> str:
    command = shlex.join([".venv/bin/python", "bench/learning.py", *argv])
    rate = (f"{sum(tokens_per_s) / len(tokens_per_s):,.0f} training tokens/s"
            if tokens_per_s else "training tokens/s not measured")
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    return (f"`{command}`  \n{time.strftime('%Y-%m-%d', time.gmtime())} · {machine} · "
            f"{rate}")


def _row(name: str, f: Figure) -> str:
    return (f"| {name} | {f.before:.1f} | {f.after:.1f} | {f.delta:+.1f} | "
            f"[{f.lower:+.1f}, {f.upper:+.1f}] |")


def table(days: list[Day], families: list[str], confidence: float = 0.9) -> str:
    """Per family and for the mean: before %, after %, delta pp and its interval."""
    if not days:
        return "No day made a candidate: nothing to measure."
    share = f"{confidence:.0%}"
    lines = [f"| family | before % | after % | Δ pp | {share} interval |", "|---|---|---|---|---|"]
    lines += [_row(f, figure(days, [f], confidence)) for f in families]
    mean = figure(days, families, confidence)
    lines.append(f"| **mean** | {mean.before:.1f} | {mean.after:.1f} | **{mean.delta:+.1f}** | "
                 f"[{mean.lower:+.1f}, {mean.upper:+.1f}] |")
    held = ", ".join(f"{len(days[0][f])}" for f in families)
    lines.append("")
    lines.append(f"{len(days)} day(s); held-out items a family a day: {held}; the interval is "
                 "a paired bootstrap over the items, resampling days (bench/intervals.py).")
    return "\n".join(lines)


def comparison(first: dict[str, list[float]], second: dict[str, list[float]],
               labels: tuple[str, str], confidence: float = 0.9) -> str:
    """Two nights' "after" answers on one kept day: the second minus the first, per item."""
    families = sorted(set(first) & set(second))
    if not families:
        return "No family was measured after both nights."
    lines = [f"{labels[1]} against {labels[0]}, on the same day's held-out items:", "",
             f"| family | {labels[0]} % | {labels[1]} % | Δ pp | {confidence:.0%} interval |",
             "|---|---|---|---|---|"]
    lines += [_row(f, compare(first, second, [f], confidence)) for f in families]
    mean = compare(first, second, families, confidence)
    lines.append(_row("**mean**", mean))
    return "\n".join(lines)


def pooled_comparison(pairs: list[tuple[dict, dict]], families: list[str],
                      confidence: float = 0.9, against: int | None = None,
                      earlier: str | None = None) -> str:
    """Nights on several kept days (``--day DIR DIR ...``): each day's (earlier night's,
    this night's) answers, the difference pooled over the days as ``--days`` pools them.
    ``against``: the kept night's number it was compared with, None for the one before;
    ``earlier`` names the other night outright (``--versus``)."""
    days = [{f: list(zip(first[f], second[f])) for f in families if f in first and f in second}
            for first, second in pairs]
    earlier = earlier or ("the night kept before it" if against is None
                          else f"kept night #{against}")
    return (f"This night against {earlier}, on each of {len(pairs)} kept days "
            "(\"before %\" is the earlier night's after %):\n\n"
            + table(days, families, confidence))


def chain_table(results: list[dict], families: list[str], k: int,
                confidence: float = 0.9) -> str:
    """After chained night k (``--nights``): what it added to night k-1, and all k nights
    against the day's "before", both paired per held-out item, over the days."""
    added, total = [], []
    for result in results:
        nights = [result.get("after") or {}] + [c.get("after") or {}
                                                 for c in result.get("chain") or []]
        if len(nights) < k or not all(set(families) <= set(n) for n in nights[k - 2:k]):
            continue
        added.append({f: list(zip(nights[k - 2][f], nights[k - 1][f])) for f in families})
        total.append({f: list(zip(result["before"][f], nights[k - 1][f])) for f in families})
    if not added:
        return f"Night {k}: no day reached it with a candidate."
    return "\n\n".join([f"Night {k} against night {k - 1} (what it added):",
                         table(added, families, confidence),
                         f"All {k} nights against the day's before:",
                         table(total, families, confidence)])
