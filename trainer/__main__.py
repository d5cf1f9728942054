"""CLI of the trainer: python -m trainer setup|sleep|train|export|eval."""

from __future__ import annotations

import argparse
import sys

from bot.config import ConfigError, load_config


def _setup(args: argparse.Namespace) -> int:
    from trainer.basemodel import ensure_embedded_model

    config = load_config(args.config)
    hf_dir, served = ensure_embedded_model(config)
    print(f"HF copy: {hf_dir}\nserved GGUF: {served}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__)
    parser.add_argument("--config", help="path to config.toml (default: embedded defaults)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help="prepare the embedded model: HF copy and q8_0 GGUF (idempotent)")
    args = parser.parse_args(argv)
    try:
        return {"setup": _setup}[args.command](args)
    except ConfigError as exc:
        print(f"config error:\n{exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
