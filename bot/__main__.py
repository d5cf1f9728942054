"""CLI of the bot: python -m bot [--config FILE] run|doctor|status."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from core.config import ConfigError, load_config


def _run(config) -> int:
    from bot.app import run_bot

    return asyncio.run(run_bot(config))


def _doctor(config) -> int:
    from bot.doctor import run_doctor

    return asyncio.run(run_doctor(config))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bot", description="Nightshift bot")
    parser.add_argument("--config", help="path to config.toml (default: embedded defaults)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="start the bot: Discord if a token is configured, else the console")
    sub.add_parser("doctor", help="print the resolved config and check every part")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"config error:\n{exc}", file=sys.stderr)
        return 2
    try:
        return {"run": _run, "doctor": _doctor}[args.command](config)
    except ConfigError as exc:  # found only when the part it configures starts
        print(f"config error:\n{exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
