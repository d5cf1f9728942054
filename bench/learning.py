"""Does a night make the model better? Measured through the product's own path.

    .venv/bin/python bench/learning.py [--model HF_DIR --gguf FILE] [--families ...]
                                       [--days N] [--nights K] [--train N --held N
                                       --samples G] [--quick]

``--days N`` (default 3) runs N independent fresh days, each in a data folder of its
own: other items (day i draws its items with seed ``--seed`` + i), another practice
(sampled at temperature), the same settings. It ends with one markdown table, ready
to paste: the command line, the date, the machine's training tokens/s, then per
family and for the mean the before %, after %, delta and a 90% interval (a paired
bootstrap over the held-out items, resampling days: ``bench/intervals.py``).

``--nights K`` chains K nights a day: after night k-1 (made live, even when its gate
refused it, so that the next one trains on top of it), a new day of practice on new
items of the same families, night k, and the same held-out items again; after each
night a table of what it added to the one before, and of all of them against "before".
With ``--keep``, the chained nights' answers are kept beside the first night's, and
``--tabulate DIR/day-1 DIR/day-2 ...`` pools those tables over kept days.

Steps, all through the real agent, llama.cpp server, sandbox and trainer:

1. before: each family's held-out items, answered by the agent (greedy,
   ``agent.temperature = 0``, its system prompt and tools), each in a
   fresh channel, scored by the item's check (``core.practice.checks``);
2. a day of practice: ``/practice`` on each family's train items (the same
   code as the command), G samples at ``practice.temperature``;
3. the night: a ``sleep`` job launched by the bot's night watch, i.e.
   ``python -m trainer sleep --job N`` as ``!sleep`` runs it, over the
   episodes since the practice began (the "before" answers are not trained
   on); its stages are timed from the job's states;
4. after: the night's release is promoted (``/promote``: the server swaps to
   it) and the held-out items are answered again. A release the gate refused
   is swapped in all the same, only to measure it (the product would not serve
   it); the gate's decision is printed beside the figures;
5. per family: before %, after %, delta in pp (an item counts when its check
   gives 1.0), the mean delta, how many held-out answers called a tool before
   and after (a night that teaches calls where none belong shows there), the
   night's wall time by stage, the rows and steps trained, and the gate's
   decision with its reasons.

The held-out items, whatever their check (exact, regex, python), are published
where the product's ``/practice`` publishes a set's held-out split
(``<data_dir>/heldout/<family>-heldout.jsonl``, ``publish_held_out``), so the night's gate
pairs them all, as it would a user's. ``train.max_tokens`` is set to the
served context, so that rows carrying the tool list are not dropped.
``--keep DIR`` also keeps a copy of the data folder as the day left it (before
the night; with several days, day i in ``DIR/day-i``); ``--day DIR [DIR ...]`` starts
from such copies and runs only steps 3-5 on each, so that two nights' settings (``--lr``,
``--batch``, ...) are compared on one day: the figures then differ only by the
night, not by the practice's sampling at temperature 0.8, which alone moved the
mean by ~10 pp between runs. Every night run on a kept day leaves its answers in
``DIR/nights/``, and a ``--day`` run prints its paired difference from the
previous night kept there, with its 90% interval, and with several kept days that
difference pooled over them (resampling days, as ``--days`` does). ``--first-attempts
G`` trains such a night on each practice group's first G attempts only, so a day whose
mixed tasks got more attempts (``practice.mixed_samples``) is compared with itself without
them.
``--quick`` runs 3 train and 2 held-out items a family, 2 samples each, at
most 3 agent steps a turn, with 4 tools offered instead of all of them: a
check that the path works, not a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.config import Config, load_config  # noqa: E402
from bot.practice.runner import publish_held_out, run_practice  # noqa: E402
from core.practice.sets import load_set  # noqa: E402
from bot.runtime import Runtime  # noqa: E402
from families import FAMILIES, items, write_set  # noqa: E402
from fixtures import find_gguf, free_port  # noqa: E402
from learning_kept import (  # noqa: E402
    DAY, SETS, compare_nights, keep_night, kept_night, missing_night, only_first_attempts,
    tabulated)
from learning_args import DEFAULT_FAMILIES, arguments  # noqa: E402
from learning_report import report, tool_calls  # noqa: E402
from learning_steps import evaluate, night  # noqa: E402
from learning_table import chain_table, days_of, header, pooled_comparison, table  # noqa: E402
from sandbox.bwrap import find_bwrap  # noqa: E402

# --quick offers these four tools, not all 40: their list is ~700 prompt tokens, not ~3,300,
# which is what makes a turn take seconds rather than a minute on a busy 2-core CPU.
QUICK_TOOLS = ["read_file", "write_file", "make_dir", "list_dir"]


def write_config(work: Path, args: argparse.Namespace) -> Path:
    """A config.toml that the bot and the trainer process both read."""
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    cache = ROOT / "data/cache"
    if cache.is_dir() and not (data / "cache").exists():
        (data / "cache").symlink_to(cache)  # the converter, fetched once by the setup step
    train = {"max_tokens": args.context}
    for key in ("epochs", "lr", "beta", "imitation", "imitation_per", "imitate_known_choices",
                "imitate_known_passing_choices",
                "min_steps", "max_epochs", "batch", "schedule", "warmup_steps", "stop_split",
                "stop_every", "compute_dtype"):
        if getattr(args, key) is not None:
            train[key] = getattr(args, key)
    sections = {
        "paths": {"data_dir": str(data)},
        "model": {"gguf": str(args.gguf), "hf_dir": str(args.model),
                  "context_tokens": args.context, "chat_format": args.chat_format},
        "server": {"port": free_port()},
        "agent": {"temperature": 0.0, "max_steps": args.max_steps,
                  "tools": args.tools or "auto"},
        "practice": {"temperature": args.temperature, "held_out_percent": 0,
                     **({} if args.mixed_samples is None else
                        {"mixed_samples": args.mixed_samples}),
                     "max_steps": args.practice_steps or min(args.max_steps,
                                                             Config().practice.max_steps)},
        "night": {"auto_promote": False, **{key: getattr(args, key) for key in (
            "imitate_passing", "anchor_demonstrated") if getattr(args, key) is not None}},
        "train": train,
    }
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    path = work / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_sets(work: Path, args: argparse.Namespace, seed: int) -> dict:
    """{family: (train set path, held-out set path)}; the held-out sets are also published
    for the night's gate as ``/practice`` publishes a set's held-out split: every check
    kind, python ones with their code, so the gate pairs them all."""
    sets = {}
    for family in args.families:
        train, held = items(family, args.train, args.held, seed)
        if len(train) < args.train:
            print(f"the {family} family has only {len(train) + len(held)} distinct items: "
                  f"{len(train)} practised, not {args.train}", flush=True)
        sets[family] = (write_set(work / SETS, family, train),
                        write_set(work / SETS, f"{family}-heldout", held))
        # Named as its set (``<family>-heldout``): practice publishes the practised set's own
        # split (empty: practice.held_out_percent is 0 here) under the family's name.
        publish_held_out(work / "data" / "heldout", f"{family}-heldout",
                         list(load_set(sets[family][1]).tasks))
    return sets


async def serve_candidate(rt: Runtime, release_id: int) -> str:
    """Serve the night's release: promoted when the gate passed it; when it refused, the
    server is swapped to it all the same, only to measure it (the product would not)."""
    release = next(r for r in await rt.store.releases() if r["id"] == release_id)
    if release["state"] == "candidate":
        return await rt.releases.promote(release_id)
    gguf = Path(release["meta"].get("gguf") or release["path"])
    lora = Path(release["meta"]["lora"]) if release["meta"].get("lora") else None
    await rt.supervisor.swap(gguf, lora=lora, mode="blue-green",
                             reason=f"bench: measure release #{release_id}")
    return (f"Release #{release_id} is {release['state']} (the gate's decision below); "
            "served anyway to measure it, as the product would not.")




async def day(rt: Runtime, args: argparse.Namespace, sets: dict, held: dict,
              result: dict) -> float:
    """Steps 1 and 2: the held-out items before, then the practice; returns when it began."""
    t0 = time.monotonic()
    for family, pset in held.items():
        result["before"][family], result["calls_before"][family], _ = await evaluate(
            rt, pset, "before")  # the answers are in the kept day's store
    result["before_s"] = time.monotonic() - t0
    since = time.time()
    t0 = time.monotonic()
    for family, (train_path, _) in sets.items():
        print((await run_practice(rt.practice, train_path, args.samples)).splitlines()[1], flush=True)
    result["practice_s"] = time.monotonic() - t0
    return since


def save_day(work: Path, result: dict, since: float) -> None:
    """Copy the data folder as the practice left it (the runtime is closed), so that
    ``--day`` can run other nights on this same day: settings compared on one day differ
    only by the night, not by the practice's sampling."""
    shutil.copytree(work / "data", work / "day", symlinks=True, copy_function=_copy_file)
    (work / "day" / DAY).write_text(json.dumps({"since": since, **result}))


def _copy_file(src: str, dst: str) -> None:
    if Path(src).is_file():  # a socket or fifo a process left behind is not data
        shutil.copy2(src, dst)


def load_day(source: Path, work: Path) -> tuple[dict, float]:
    """A day kept by ``--keep`` (its data folder before the night) copied into ``work``."""
    kept = source / "day"
    if not (kept / DAY).is_file():
        raise SystemExit(f"{source} holds no kept day ({kept / DAY} is missing): run the bench "
                         "with --keep DIR first")
    shutil.copytree(kept, work / "data", symlinks=True, copy_function=_copy_file)
    saved = json.loads((work / "data" / DAY).read_text())
    since = saved.pop("since")
    return {**saved, "after": {}, "day_from": str(source)}, since


async def run(args: argparse.Namespace, work: Path, seed: int, keep: bool = False,
              kept_day: Path | None = None) -> dict:
    """One day (its items drawn with ``seed``) and its night, in ``work``; with ``keep``,
    the day is kept there for ``--day``. From a ``kept_day`` only the night and what follows."""
    if kept_day:
        result, since = load_day(kept_day, work)
        seed = result.get("seed", seed)  # the kept day's items
    sets = write_sets(work, args, seed)
    config = load_config(write_config(work, args))
    if kept_day and args.first_attempts:
        marked = await only_first_attempts(config.store_path, args.first_attempts)
        print(f"--first-attempts {args.first_attempts}: {marked} later attempts left out",
              flush=True)
    t = config.train
    print(f"work dir: {work}; model {args.gguf.name}; families {', '.join(args.families)}; "
          f"{args.train} train + {args.held} held-out items each (seed {seed}); "
          f"{args.samples} samples"
          + (f" ({config.practice.mixed_samples} in all where they score differently)"
             if config.practice.mixed_samples > args.samples else "") + "; "
          f"tools: {', '.join(args.tools) or 'auto (the default)'}; max steps {args.max_steps} "
          f"({config.practice.max_steps} in practice); chat format "
          f"{args.chat_format}; lr {t.lr:g} {t.schedule}, warmup {t.warmup_steps}, "
          f"imitation {t.imitation:g} per {t.imitation_per}"
          + ("" if t.imitate_known_choices else "; known choices not imitated")
          + (f"; stop split {t.stop_split:g} every {t.stop_every}" if t.stop_split else "")
          + ("; passing attempts imitated" if config.night.imitate_passing else "")
          + ("" if t.imitate_known_passing_choices else " (their known choices not)")
          + ("" if config.night.anchor_demonstrated else "; shown groups not anchored")
          + (f"; the day kept in {kept_day}" if kept_day else ""),
          flush=True)
    held = {f: load_set(paths[1]) for f, paths in sets.items()}
    if not kept_day:
        result = {"before": {}, "after": {}, "calls_before": {}, "seed": seed}
        rt = await Runtime.start(config)
        rt.practice.listeners.append(show)
        try:
            since = await day(rt, args, sets, held, result)
        finally:
            await rt.close()
        if keep:
            save_day(work, result, since)
    rt = await Runtime.start(config)
    try:
        result["night"] = await night(rt, since, args.night_timeout)
        release_id = result["night"]["job"]["progress"].get("release_id")
        if release_id is not None:
            print("  " + await serve_candidate(rt, release_id), flush=True)
            result["calls_after"], result["answers_after"] = {}, {}
            for family, pset in held.items():
                (result["after"][family], result["calls_after"][family],
                 result["answers_after"][family]) = await evaluate(rt, pset, "after")
        result["chain"] = []
        for k in range(2, args.nights + 1):
            if not await chained_night(rt, args, work, seed, k, held, result):
                break
    finally:
        await rt.close()
    return result


async def chained_night(rt: Runtime, args: argparse.Namespace, work: Path, seed: int, k: int,
                        held: dict, result: dict) -> bool:
    """Night k (``--nights``): a new day of practice on new items of the same families,
    then a night on top of night k-1, then the same held-out items again. Night k-1 is made
    live first when the gate refused it (here only, so that the nights chain: the product
    would keep serving the model before it)."""
    last = result["chain"][-1] if result["chain"] else result
    release_id = ((last.get("night") or {}).get("job") or {}).get("progress", {}).get("release_id")
    if release_id is None or not last.get("after"):
        print(f"night {k}: night {k - 1} made no candidate, so no chain", flush=True)
        return False
    release = next(r for r in await rt.store.releases() if r["id"] == release_id)
    if release["state"] != "live":
        await rt.store.set_release_state(release_id, "live")
        print(f"  release #{release_id} ({release['state']}) made live to chain on it "
              "(the bench only)", flush=True)
    print(f"\n## night {k}: a new day of practice, then a night on top of night {k - 1}",
          flush=True)
    since = time.time()
    for family in args.families:
        train, _ = items(family, args.train * k, args.held, seed)  # the held-out items stay
        path = write_set(work / SETS, f"{family}-night{k}", train[args.train * (k - 1):])
        print((await run_practice(rt.practice, path, args.samples)).splitlines()[1], flush=True)
    entry = {"night": await night(rt, since, args.night_timeout), "after": {}, "calls_after": {}}
    result["chain"].append(entry)
    new_id = entry["night"]["job"]["progress"].get("release_id")
    if new_id is None:
        return False
    print("  " + await serve_candidate(rt, new_id), flush=True)
    for family, pset in held.items():
        entry["after"][family], entry["calls_after"][family], _ = await evaluate(
            rt, pset, f"after{k}")
    print(tool_calls({"calls_before": result.get("calls_before"),
                      "calls_after": entry["calls_after"]}), flush=True)
    return True


def tokens_per_s(result: dict) -> float | None:
    trained = (((result.get("night") or {}).get("job") or {}).get("progress") or {}).get("trained")
    return (trained or {}).get("tokens_per_s")


async def show(line: str) -> None:
    print("  " + line, flush=True)


def main() -> None:
    parser = arguments(__doc__.split("\n")[0])
    args = parser.parse_args()
    if (args.versus or args.night is not None) and not args.tabulate:
        parser.error(f"{'--versus' if args.versus else '--night'} reads kept days: use it "
                     "with --tabulate")
    if args.tabulate:
        try:
            print(tabulated(args.tabulate, args.families or list(FAMILIES), sys.argv[1:],
                            args.versus, args.against, args.night))
        except ValueError as error:
            parser.error(str(error))
        return
    args.families = args.families or DEFAULT_FAMILIES
    if args.day and args.keep and args.keep.resolve() in {d.resolve() for d in args.day}:
        parser.error("--day and --keep must be different directories")
    if args.first_attempts is not None and (not args.day or args.first_attempts < 1):
        parser.error("--first-attempts G (G >= 1) trains a kept day's night (--day DIR) on "
                     "each group's first G attempts")
    if args.quick:
        args.train, args.held, args.samples, args.max_steps = 3, 2, 2, 3
        args.tools = args.tools or QUICK_TOOLS
    args.gguf = find_gguf(args.gguf)
    if "tool" in args.families and find_bwrap() is None:
        # Without the sandbox every python check comes back unjudged: a whole run for nothing.
        parser.error("the tool family's checks run in the sandbox, and bubblewrap is missing "
                     "(apt-get install bubblewrap); `python -m bot doctor` checks a set-up")
    if args.against is not None:
        if not args.day:
            parser.error("--against compares with a night kept beside a kept day: use it "
                         "with --day")
        for folder in args.day:
            if kept_night(folder.resolve(), args.against) is None:
                parser.error(missing_night(folder, args.against))
    if args.day:
        args.days = len(args.day)  # one night on each kept day
    elif args.days is None:
        args.days = 1 if args.quick else 3
    with tempfile.TemporaryDirectory(prefix="nightshift-learning-") as tmp:
        base = args.keep.resolve() if args.keep else Path(tmp)
        results = [run_days(args, base, i) for i in range(args.days)]
    rates = [r for r in map(tokens_per_s, results) if r]
    days = days_of(results)
    print("\n" + header(sys.argv[1:], rates) + "\n")
    print(table(days, args.families))
    for k in range(2, args.nights + 1):
        print("\n" + chain_table(results, args.families, k))
    pairs = [r["compared"] for r in results if r.get("compared")]
    if len(pairs) > 1:  # the kept days' nights against this one's, pooled over the days
        print("\n" + pooled_comparison(pairs, args.families, against=args.against))
    if len(days) < len(results):
        print(f"\n{len(results) - len(days)} of {len(results)} days made no candidate and are "
              "left out of the table.")


def run_days(args: argparse.Namespace, base: Path, i: int) -> dict:
    """Day i of ``--days``: its own work folder (``base`` itself for a single day)."""
    work = base if args.days == 1 else base / f"day-{i + 1}"
    work.mkdir(parents=True, exist_ok=True)
    if args.days > 1:
        print(f"\n## day {i + 1} of {args.days}", flush=True)
    started = time.monotonic()
    kept_day = args.day[i] if args.day else None
    result = asyncio.run(run(args, work, args.seed + i, bool(args.keep), kept_day))
    report(result, started)
    if kept_day or args.keep:
        folder = kept_day.resolve() if kept_day else work
        kept = keep_night(folder, result, sys.argv[1:])
        if kept_day and (compared := compare_nights(folder, kept, args.against)):
            text, result["compared"] = compared
            print("\n" + text)
    return result


if __name__ == "__main__":
    main()
