"""Does a night make the model better? Measured through the product's own path.

    .venv/bin/python bench/learning.py [--model HF_DIR --gguf FILE] [--families ...]
                                       [--train N --held N --samples G] [--quick]

Steps, all through the real agent, llama.cpp server, sandbox and trainer:

1. before: each family's held-out items, answered by the agent (greedy,
   ``agent.temperature = 0``, its system prompt and tools), each in a
   fresh channel, scored by the item's check (``bot.practice.checks``);
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
   gives 1.0), the mean delta, the night's wall time by stage, the rows and
   steps trained, and the gate's decision with its reasons.

The held-out items that have an exact answer are also given to the night's
gate as probes (``night.probes_file``). ``train.max_tokens`` is set to the
served context, so that rows carrying the tool list are not dropped.
``--keep DIR`` also keeps a copy of the data folder as the day left it (before
the night); ``--day DIR`` starts from that copy and runs only steps 3-5, so
that two nights' settings (``--lr``, ``--batch``, ...) are compared on one
day: the figures then differ only by the night, not by the practice's
sampling at temperature 0.8, which alone moved the mean by ~10 pp between runs.
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

from bot.config import Config, load_config  # noqa: E402
from bot.night.jobs import ACTIVE  # noqa: E402
from bot.practice.checks import judge  # noqa: E402
from bot.practice.runner import run_practice  # noqa: E402
from bot.practice.sets import PracticeSet, load_set  # noqa: E402
from bot.runtime import Runtime  # noqa: E402
from families import FAMILIES, items, write_set  # noqa: E402
from fixtures import find_gguf, free_port  # noqa: E402
from sandbox.bwrap import find_bwrap  # noqa: E402

DEFAULT_HF = ROOT / "data/models/smollm2-135m-instruct-hf"
# --quick offers these four tools, not all 40: their list is ~700 prompt tokens, not ~3,300,
# which is what makes a turn take seconds rather than a minute on a busy 2-core CPU.
QUICK_TOOLS = ["read_file", "write_file", "make_dir", "list_dir"]


def write_config(work: Path, args: argparse.Namespace, probes: Path) -> Path:
    """A config.toml that the bot and the trainer process both read."""
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    cache = ROOT / "data/cache"
    if cache.is_dir() and not (data / "cache").exists():
        (data / "cache").symlink_to(cache)  # the converter, fetched once by the setup step
    train = {"max_tokens": args.context}
    for key in ("epochs", "lr", "beta", "imitation", "min_steps", "batch", "schedule",
                "warmup_steps"):
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
                     "max_steps": args.practice_steps or min(args.max_steps,
                                                             Config().practice.max_steps)},
        "night": {"probes_file": str(probes), "auto_promote": False},
        "train": train,
    }
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    path = work / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_sets(work: Path, args: argparse.Namespace) -> tuple[dict, Path]:
    """{family: (train set path, held-out set path)} and the gate's probes file."""
    sets, probes = {}, []
    for family in args.families:
        train, held = items(family, args.train, args.held, args.seed)
        if len(train) < args.train:
            print(f"the {family} family has only {len(train) + len(held)} distinct items: "
                  f"{len(train)} practised, not {args.train}", flush=True)
        sets[family] = (write_set(work / "sets", family, train),
                        write_set(work / "sets", f"{family}-heldout", held))
        probes += [{"prompt": t["prompt"], "expected": t["check"]["exact"]}
                   for t in held if "exact" in t.get("check", {})]
    path = work / "probes.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in probes))
    return sets, path


async def evaluate(rt: Runtime, pset: PracticeSet, phase: str) -> list[float]:
    """Each held-out task answered once by the agent in a fresh channel, and checked."""
    rewards = []
    for task in pset.tasks:
        channel = f"bench-{phase}-{pset.name}-{task.id}"
        result = await rt.turn(channel, task.prompt, "bench")
        ctx = rt.spaces.context(channel)
        if not result.ok:
            rewards.append(0.0)
            continue
        verdict = await judge(task, result.reply, ctx.workspace, ctx.services["sandbox"],
                              rt.config.practice.check_timeout_s)
        rewards.append(verdict.reward if verdict.judged else 0.0)
    return rewards


async def night(rt: Runtime, since: float, timeout_s: float) -> dict:
    """Launch the night job as the bot does, and time each state it passes through."""
    job_id = await rt.store.create_job("sleep", {"requested_by": "bench/learning.py",
                                                 "channel": "bench", "since": since,
                                                 "requested_at": time.time()})
    started = time.monotonic()
    await rt.night.launch(job_id)
    stages: dict[str, float] = {}
    state, entered = None, started
    while True:
        job = await rt.store.job(job_id)
        now = time.monotonic()
        if job["state"] != state:
            if state is not None:
                stages[state] = stages.get(state, 0.0) + now - entered
            state, entered = job["state"], now
            print(f"  night #{job_id}: {state} at {now - started:.0f} s", flush=True)
        if state not in ACTIVE:
            break
        if now - started > timeout_s:
            await rt.store.update_job(job_id, state="cancelled", error="bench timeout")
            print(f"  night #{job_id}: cancelled after {timeout_s:.0f} s", flush=True)
            job = await rt.store.job(job_id)
            break
        await asyncio.sleep(1.0)
    return {"job": job, "wall_s": time.monotonic() - started, "stages": stages}


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


DAY = "day.json"  # a kept day's "before" answers and where its practice began


async def day(rt: Runtime, args: argparse.Namespace, sets: dict, held: dict,
              result: dict) -> float:
    """Steps 1 and 2: the held-out items before, then the practice; returns when it began."""
    t0 = time.monotonic()
    for family, pset in held.items():
        result["before"][family] = await evaluate(rt, pset, "before")
    result["before_s"] = time.monotonic() - t0
    since = time.time()
    t0 = time.monotonic()
    for family, (train_path, _) in sets.items():
        print((await run_practice(rt, train_path, args.samples)).splitlines()[1], flush=True)
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


async def run(args: argparse.Namespace, work: Path) -> dict:
    if args.day:
        result, since = load_day(args.day, work)
    sets, probes = write_sets(work, args)
    config = load_config(write_config(work, args, probes))
    t = config.train
    print(f"work dir: {work}; model {args.gguf.name}; families {', '.join(args.families)}; "
          f"{args.train} train + {args.held} held-out items each; {args.samples} samples; "
          f"tools: {', '.join(args.tools) or 'auto (the default)'}; max steps {args.max_steps} "
          f"({config.practice.max_steps} in practice); chat format "
          f"{args.chat_format}; lr {t.lr:g} {t.schedule}, warmup {t.warmup_steps}, "
          f"imitation {t.imitation:g}" + (f"; the day kept in {args.day}" if args.day else ""),
          flush=True)
    held = {f: load_set(paths[1]) for f, paths in sets.items()}
    if not args.day:
        result = {"before": {}, "after": {}}
        rt = await Runtime.start(config)
        rt.practice_listeners.append(show)
        try:
            since = await day(rt, args, sets, held, result)
        finally:
            await rt.close()
        if args.keep:
            save_day(work, result, since)
    rt = await Runtime.start(config)
    try:
        result["night"] = await night(rt, since, args.night_timeout)
        release_id = result["night"]["job"]["progress"].get("release_id")
        if release_id is not None:
            print("  " + await serve_candidate(rt, release_id), flush=True)
            for family, pset in held.items():
                result["after"][family] = await evaluate(rt, pset, "after")
    finally:
        await rt.close()
    return result


async def show(line: str) -> None:
    print("  " + line, flush=True)


def report(result: dict, started: float) -> None:
    print(f"\n{'family':<12}{'before %':>10}{'after %':>10}{'delta pp':>10}")
    deltas = []
    for family, before in result["before"].items():
        b = 100 * sum(r == 1.0 for r in before) / len(before)
        after = result["after"].get(family)
        if after is None:
            print(f"{family:<12}{b:>10.1f}{'n/a':>10}{'n/a':>10}")
            continue
        a = 100 * sum(r == 1.0 for r in after) / len(after)
        deltas.append(a - b)
        print(f"{family:<12}{b:>10.1f}{a:>10.1f}{a - b:>+10.1f}")
    mean = f"{sum(deltas) / len(deltas):+.1f} pp" if deltas else "n/a (no candidate)"
    print(f"mean delta: {mean}")
    night_ = result.get("night", {})
    job = night_.get("job") or {}
    progress = job.get("progress", {})
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in night_.get("stages", {}).items())
    print(f"night #{job.get('id')}: {job.get('state')}, wall {night_.get('wall_s', 0):.0f} s "
          f"({stages})")
    timings = progress.get("timings") or {}
    if timings:
        print("  part 1 stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    counts, trained = progress.get("counts") or {}, progress.get("trained") or {}
    excluded = {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("excluded:")}
    print(f"episodes: {counts.get('episodes', 'n/a')} kept, excluded {excluded or 'none'}")
    print(f"rows: {counts.get('rows', 'n/a')} in the dataset; trained: "
          f"{trained.get('sequences', 'n/a')} sequences, {trained.get('steps', 'n/a')} steps, "
          f"{trained.get('tokens', 'n/a')} tokens in {trained.get('seconds', 'n/a')} s")
    gate = progress.get("gate")
    if gate:
        outcome = gate.get("outcome") or ("promote" if gate["passed"] else "reject")
        gain = "no paired items" if gate.get("gain") is None else f"gain {gate['gain']:+.3f}"
        print(f"gate: {outcome} ({gain}); "
              + "; ".join(gate.get("reasons") or []))
        if gate.get("open_before") is not None and gate.get("open_after") is not None:
            print("open chat (the gate's prompts, judged in [-1, 1]): "
                  f"{gate['open_before']:+.2f} before, {gate['open_after']:+.2f} after")
    elif job.get("error"):
        print(f"night error: {job['error'].splitlines()[0][:300]}")
    kept = f" (the day kept in {result['day_from']})" if result.get("day_from") else ""
    print(f"before {result.get('before_s', 0):.0f} s, practice {result.get('practice_s', 0):.0f}"
          f" s{kept}; {'this run' if kept else 'whole benchmark'} "
          f"{time.monotonic() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_HF, help="the HF checkpoint")
    parser.add_argument("--gguf", help="the GGUF served (its conversion of --model)")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--train", type=int, default=16, help="practised items a family")
    parser.add_argument("--held", type=int, default=20, help="held-out items a family")
    parser.add_argument("--samples", type=int, default=4, help="attempts per practised item")
    parser.add_argument("--temperature", type=float, default=0.8, help="practice temperature")
    parser.add_argument("--max-steps", type=int, default=Config().agent.max_steps,
                        help="agent.max_steps")
    parser.add_argument("--context", type=int, default=Config().model.context_tokens,
                        help="model.context_tokens (and train.max_tokens)")
    parser.add_argument("--epochs", type=int), parser.add_argument("--lr", type=float)
    parser.add_argument("--beta", type=float)
    parser.add_argument("--schedule", choices=["constant", "linear", "cosine"],
                        help="train.schedule (the learning rate over the steps)")
    parser.add_argument("--warmup-steps", type=int, help="train.warmup_steps")
    parser.add_argument("--imitation", type=float, help="train.imitation (the demonstrations' weight)")
    parser.add_argument("--min-steps", type=int, help="train.min_steps")
    parser.add_argument("--batch", type=int, help="train.batch (sequences per optimizer step)")
    parser.add_argument("--practice-steps", type=int,
                        help="practice.max_steps (default: its default, at most --max-steps)")
    parser.add_argument("--chat-format", default=Config().model.chat_format,
                        help="model.chat_format (plain chatml offers no tool calls)")
    parser.add_argument("--tools", nargs="*", default=[],
                        help="agent.tools: the tools offered (default: auto, the product's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--night-timeout", type=float, default=3600.0)
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it, with "
                        "a copy of the day before the night (for --day)")
    parser.add_argument("--day", type=Path, help="skip the day: take the held-out answers "
                        "before and the practice from a directory kept by --keep (same families, "
                        "items and seed), and run only the night and the answers after")
    parser.add_argument("--quick", action="store_true", help="3 train / 2 held-out, 2 samples")
    args = parser.parse_args()
    if args.day and args.keep and args.day.resolve() == args.keep.resolve():
        parser.error("--day and --keep must be different directories")
    if args.quick:
        args.train, args.held, args.samples, args.max_steps = 3, 2, 2, 3
        args.tools = args.tools or QUICK_TOOLS
    args.gguf = find_gguf(args.gguf)
    if "tool" in args.families and find_bwrap() is None:
        # Without the sandbox every python check comes back unjudged: a whole run for nothing.
        parser.error("the tool family's checks run in the sandbox, and bubblewrap is missing "
                     "(apt-get install bubblewrap); `python -m bot doctor` checks a set-up")
    started = time.monotonic()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        report(asyncio.run(run(args, args.keep.resolve())), started)
        return
    with tempfile.TemporaryDirectory(prefix="nightshift-learning-") as tmp:
        report(asyncio.run(run(args, Path(tmp))), started)


if __name__ == "__main__":
    main()
