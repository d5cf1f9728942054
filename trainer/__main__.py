"""CLI of the trainer: python -m trainer [--config FILE] setup|sleep|train|export|eval."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime
from pathlib import Path

from core.config import ConfigError, load_config


def _since(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text).timestamp()


def _setup(config, args) -> int:
    from trainer.basemodel import ensure_model

    hf_dir, served = ensure_model(config)
    print(f"HF copy: {hf_dir}\nserved GGUF: {served}")
    return 0


async def _answers(config) -> bool:
    """Whether something listens where the night will ask the live model to judge; an
    external server is not ours to start (unreachable, it fails the night, resumable).
    Where: the port the bot's server moved to on its last swap (core.model.served_at)."""
    from urllib.parse import urlsplit

    from core.model.served_at import served_url
    from serving.supervisor import ServerSupervisor

    supervisor = ServerSupervisor(config, port=urlsplit(served_url(config)).port)
    return not supervisor.kind.spawns or await supervisor.port_in_use()


async def _night_with_server(config, job: int | None, since: float | None,
                             bot_serves: bool = False) -> int:
    """Run the night; when no bot serves the model (a night resumed by hand after the bot
    stopped), serve the live model here for the night's length: the judge and the gate's
    open-chat check ask it, and a resumed night failed at the gate for want of it."""
    from serving.releases import serve_live
    from serving.supervisor import ServerSupervisor
    from core.storage.store import Store
    from trainer.sleep import run_night

    if bot_serves or await _answers(config):
        return await run_night(config, job, since)
    supervisor = ServerSupervisor(config)
    store = await Store.open(config.store_path)
    try:
        serving = await serve_live(store, supervisor)
    finally:
        await store.close()
    print(f"no model server answers at {config.base_url}: serving "
          f"{serving or 'the base model'} here for this night", file=sys.stderr, flush=True)
    await supervisor.start()
    try:
        return await run_night(config, job, since)
    finally:
        await supervisor.stop()


def _sleep(config, args) -> int:
    from core.storage.store import Store

    job_id = asyncio.run(_night_with_server(config, args.job, _since(args.since),
                                             args.bot_serves))

    async def report() -> dict:
        store = await Store.open(config.store_path)
        try:
            return await store.job(job_id)
        finally:
            await store.close()

    job = asyncio.run(report())
    print(json.dumps({"job": job_id, "state": job["state"], "error": job["error"],
                      "progress": job["progress"]}, indent=1, default=str))
    return 0 if job["state"] in ("awaiting_promotion", "done", "live") else 1


def _train(config, args) -> int:
    from trainer.train_cli import main as train_main

    return train_main(args.rest, config)


def _export(config, args) -> int:
    from trainer.converter import fetch_converter
    from trainer.export import export_release, verify_release

    gguf = export_release(Path(args.adapter), Path(args.base), Path(args.out),
                          fetch_converter(config.cache_dir), night=args.night, step=args.step,
                          mode=args.mode, base_gguf=config.served_gguf)
    verify_release(Path(args.out), Path(args.base))
    print(f"release {args.out}: serve {gguf}")
    return 0


def _eval(config, args) -> int:
    from core.storage.store import Store
    from trainer.gate import run_gate

    rows = [json.loads(l) for l in Path(args.data).read_text().splitlines() if l.strip()]
    inputs = {"heldout": list(args.heldout or []), "agent_view": args.agent_view}

    async def run() -> dict:
        store = await Store.open(config.store_path)
        try:
            report = await run_gate(config, store, rows, inputs,
                                    (Path(args.live or config.served_gguf), None),
                                    (Path(args.candidate), None))
        finally:
            await store.close()
        return report.as_dict()

    report = asyncio.run(run())
    print(json.dumps(report, indent=1))
    return 0 if report["passed"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__)
    parser.add_argument("--config", help="path to config.toml (default: embedded defaults)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help="prepare the model: the embedded one (HF copy, q8_0 GGUF), "
                   "or model.hf_dir's q8_0 conversion (idempotent)")
    sleep = sub.add_parser("sleep", help="run (or resume) a night: judge, train, export, gate")
    sleep.add_argument("--job", type=int, help="resume this night job")
    sleep.add_argument("--since", help="collect episodes since (ISO time or unix seconds)")
    sleep.add_argument("--bot-serves", action="store_true",
                       help="the bot that started this night serves the model: never start "
                       "a server here, even while the bot's server restarts (as !sleep runs it)")
    # Its own flags are trainer.train_cli's (--data, --base, ...): passed on whole. (A
    # REMAINDER argument dropped them: argparse does not take "--data" as a remainder.)
    sub.add_parser("train", add_help=False,
                   help="train a LoRA on a night's JSONL with [train]'s settings (train --help)")
    export = sub.add_parser("export", help="merge an adapter and convert it into a release")
    export.add_argument("--adapter", required=True)
    export.add_argument("--base", required=True)
    export.add_argument("--out", required=True)
    export.add_argument("--mode", choices=["merged", "adapter"], default="merged")
    export.add_argument("--night", type=int, default=0)
    export.add_argument("--step", type=int, default=0)
    evaluate = sub.add_parser("eval", help="gate a candidate GGUF against the live one")
    evaluate.add_argument("--candidate", required=True)
    evaluate.add_argument("--live")
    evaluate.add_argument("--data", required=True, help="a night's JSONL (its eval split)")
    evaluate.add_argument("--heldout", action="append",
                          help="JSONL of {id, prompt, check} held-out items (repeatable)")
    evaluate.add_argument("--agent-view", help="JSON {system, tools} the agent renders with")
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "train":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"config error:\n{exc}", file=sys.stderr)
        return 2
    commands = {"setup": _setup, "sleep": _sleep, "train": _train, "export": _export,
                "eval": _eval}
    return commands[args.command](config, args)


if __name__ == "__main__":
    sys.exit(main())
