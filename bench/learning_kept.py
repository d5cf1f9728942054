"""The nights kept beside a kept day (``bench/learning.py --keep`` / ``--day``): each night's
answers after, and the comparison of one night with an earlier one on the same items."""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

from core.storage.events import Event
from core.storage.store import Store
from learning_table import chain_table, comparison, days_of, header, pooled_comparison, table

SETS = "sets"  # in a kept day's folder: the practised and held-out items, one file a family
DAY = "day.json"  # a kept day's "before" answers and where its practice began
NIGHTS = "nights"  # in a kept day's folder: each night's answers after, for comparisons


async def only_first_attempts(db: Path, keep: int) -> int:
    """Leave every practice attempt past its group's first ``keep`` unjudged in the kept
    day's store ``db``, by the night's contract (an episode's latest verifier event is its
    verdict; one with no reward is left out), so a day practised with more attempts for its
    mixed tasks (``practice.mixed_samples``) trains as one without them; the number left
    out. Attempt k answered in the channel ending ``-k``; a reference's channel ends
    ``-reference`` and stays."""
    store = await Store.open(db)
    try:
        latest = {e["episode_id"]: e for e in await store.events(Event.VERIFIER_REWARD)
                  if e["episode_id"] is not None}  # in id order: the last one wins
        marked = 0
        for episode, event in latest.items():
            number = re.fullmatch(r"practice-.+-(\d+)", event["channel_id"])
            if number and int(number[1]) >= keep and event["payload"].get("reward") is not None:
                await store.add_event(event["channel_id"], episode, Event.VERIFIER_REWARD, {
                    **event["payload"], "reward": None,
                    "error": f"left out by --first-attempts {keep}"})
                marked += 1
    finally:
        await store.close()
    return marked


def keep_night(folder: Path, result: dict, argv: list[str]) -> Path:
    """Leave this night's answers beside the kept day, so later nights compare with it, and
    those of the nights chained after it (``--nights``), so ``--tabulate`` pools them."""
    out = folder / NIGHTS
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{len(list(out.iterdir()))}.json"
    chain = [{"after": c.get("after") or {}} for c in result.get("chain") or []]
    path.write_text(json.dumps({"argv": argv, "after": result.get("after") or {},
                                "calls_after": result.get("calls_after") or {},
                                "answers_after": result.get("answers_after") or {},
                                "chain": chain}))
    return path


def kept_result(folder: Path, number: int | None = None) -> dict:
    """A day kept by ``--keep`` as a result: its answers before, and after its own night
    (the first kept there, or the night kept as ``number``), for ``--tabulate``."""
    day = json.loads((folder / "day" / DAY).read_text())
    path = night_file(folder, number)
    night = json.loads(path.read_text()) if path else {}
    return {"before": day["before"], "after": night.get("after") or {},
            "chain": night.get("chain") or [], "seed": day.get("seed")}


def kept_after(folder: Path, number: int | None = None) -> dict:
    """The answers after the night kept in ``folder`` as ``number`` (the first, by default)."""
    if (path := night_file(folder, number)) is None:
        raise ValueError(f"no night is kept in {folder / NIGHTS}")
    return json.loads(path.read_text())["after"]


def night_file(folder: Path, number: int | None = None) -> Path | None:
    """The night kept in ``folder`` as ``number``, or its first (None when it keeps none);
    a ValueError naming the kept numbers when ``number`` is not kept."""
    if number is None:
        return next(iter(sorted((folder / NIGHTS).glob("*.json"))), None)
    if (path := kept_night(folder, number)) is None:
        raise ValueError(missing_night(folder, number))
    return path


def versus_pairs(folders: list[Path], others: list[Path], against: int | None = None,
                 night: int | list[int | None] | None = None) -> list[tuple[dict, dict]]:
    """Two settings, each run with ``--days --keep`` from the same ``--seed``: each day's
    (other setting's first night or night ``against``, this one's first night or night
    ``night``) answers, to compare item by item. The days are matched by their held-out
    items, which must be the same files."""
    if len(folders) != len(others):
        raise ValueError(f"{len(folders)} kept days against {len(others)}: give one of each "
                         "setting's days for every day, in the same order")
    pairs = []
    for folder, other, number in zip(folders, others, per_day(night, folders)):
        here, there = (sorted(p.name for p in (f / SETS).glob("*-heldout.jsonl"))
                       for f in (folder, other))
        if not here or here != there or any(
                (folder / SETS / n).read_bytes() != (other / SETS / n).read_bytes()
                for n in here):
            raise ValueError(f"{folder} and {other} do not hold the same held-out items: "
                             "keep both settings' days with the same --seed and families")
        pairs.append((kept_after(other, against), kept_after(folder, number)))
    return pairs


def night_number(path: Path) -> str:
    """The -N that ends a kept night's file name (``keep_night`` numbers them)."""
    return path.stem.rsplit("-", 1)[-1]


def kept_night(folder: Path, number: int) -> Path | None:
    """The night kept in ``folder`` with this number."""
    return next((p for p in sorted((folder / NIGHTS).glob("*.json"))
                 if night_number(p) == str(number)), None)


def missing_night(folder: Path, number: int) -> str:
    """The error for a night ``folder`` does not keep, with the numbers it does keep."""
    numbers = sorted(map(night_number, (folder / NIGHTS).glob("*.json")),
                     key=lambda n: int(n) if n.isdigit() else -1)
    return f"no night #{number} is kept in {folder / NIGHTS} (kept: {', '.join(numbers) or 'none'})"


def compare_nights(folder: Path, latest: Path, against: int | None = None
                   ) -> tuple[str, tuple | None] | None:
    """This night against one kept before it on the same day (kept night ``against``, or
    the last one), item by item: the text, and the two nights' answers (None when one made
    no candidate)."""
    kept = sorted(p for p in (folder / NIGHTS).glob("*.json") if p != latest)
    earlier = kept_night(folder, against) if against is not None else (kept or [None])[-1]
    if earlier is None:
        return None
    first, second = (json.loads(p.read_text()) for p in (earlier, latest))
    if not first["after"] or not second["after"]:
        return "One of the two nights made no candidate: nothing to compare.", None
    text = comparison(first["after"], second["after"], (earlier.stem, latest.stem))
    return "\n".join([text, "", f"- {earlier.stem}: `{shlex.join(first['argv'])}`",
                      f"- {latest.stem}: `{shlex.join(second['argv'])}`"]), \
        (first["after"], second["after"])


def per_day(night: int | list[int | None] | None, folders: list[Path]) -> list[int | None]:
    """``--night``: one number for every day, or one a day (a default's nights kept under
    different numbers on days made at different times)."""
    if night is None or isinstance(night, int):
        return [night] * len(folders)
    if len(night) == 1:
        return list(night) * len(folders)
    if len(night) != len(folders):
        raise ValueError(f"--night gives {len(night)} numbers for {len(folders)} days: give "
                         "one, or one a day in the order of --tabulate")
    return list(night)


def tabulated(folders: list[Path], families: list[str], argv: list[str],
              versus: list[Path] | None = None, against: int | None = None,
              night: int | list[int] | None = None) -> str:
    """``--tabulate``: the kept days' table, each day with its own first night (or the one
    kept as ``night``), and the nights chained after it (``--nights``) pooled over the days
    that kept them; with ``versus``, also each day's night against the matching day's
    there, pooled (a ValueError, before anything is printed, when the days do not match)."""
    nights = per_day(night, folders)
    results = [kept_result(d, n) for d, n in zip(folders, nights)]
    days = days_of(results)
    families = [f for f in families if all(f in d for d in days)]
    parts = [header(argv, []), table(days, families)]
    chained = max((len(r["chain"]) for r in results), default=0)
    parts += [chain_table(results, families, k) for k in range(2, chained + 2)]
    if versus:
        pairs = versus_pairs(folders, versus, against, nights)
        theirs = "the first night" if against is None else f"night #{against}"
        parts.append(pooled_comparison(pairs, families, earlier=(
            f"{theirs} of the days in {', '.join(map(str, versus))}")))
    return "\n\n".join(parts)
