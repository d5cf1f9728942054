"""``python -m trainer.train`` and ``python -m trainer [--config F] train``: train a LoRA on
a night's JSONL by hand. Every hyperparameter defaults to the config's ``[train]``
(``trainer.settings.Settings.of``); a flag overrides it for this run."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from core.config import Config
from core.model.chat_format import resolve
from trainer.losses import IMITATION_PER
from trainer.lr_schedule import SCHEDULES
from trainer.settings import Settings, checkpointing, resolved_dtype
from trainer.train import train


def read_rows(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: list[str] | None = None, config: Config | None = None) -> int:
    """Train by hand; ``config`` (``python -m trainer --config F train``) gives the defaults."""
    defaults = Settings() if config is None else \
        Settings.of(config, chat_format=resolve(config).name)
    prog = "python -m trainer train" if config is not None else "python -m trainer.train"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="the night's training set (JSONL)")
    parser.add_argument("--base", required=True, help="the HF checkpoint to start from")
    parser.add_argument("--out", required=True, help="where the PEFT adapter is written")
    for name in ("steps", "epochs", "min_steps", "max_epochs", "batch", "micro_batch", "micro_tokens",
                 "max_tokens", "seed", "warmup_steps",
                 "chunk"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    for name in ("beta", "echo_lambda", "imitation", "lr"):
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(defaults, name))
    parser.add_argument("--imitation-per", choices=IMITATION_PER,
                        default=defaults.imitation_per,
                        help="what the demonstrations' cross-entropy averages over")
    parser.add_argument("--imitate-known-choices", action=argparse.BooleanOptionalAction,
                        default=defaults.imitate_known_choices,
                        help="also imitate a reference's choice under the tool list where "
                             "most attempts of its group made it too (trainer.examples)")
    parser.add_argument("--imitate-known-passing-choices", action=argparse.BooleanOptionalAction,
                        default=defaults.imitate_known_passing_choices,
                        help="the same for a passing attempt imitated beside OAPL")
    parser.add_argument("--schedule", choices=SCHEDULES, default=defaults.schedule,
                        help="the learning rate over the steps (trainer.lr_schedule)")
    parser.add_argument("--chat-format", default=defaults.chat_format,
                        help="the chat format the server used (python -m bot doctor says which)")
    parser.add_argument("--compute-dtype", choices=("auto", "float32", "bfloat16"),
                        default=(config or Config()).train.compute_dtype,
                        help="the matrix products' dtype (auto: bfloat16 where native)")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    args = parser.parse_args(argv)
    chosen = {k: v for k, v in vars(args).items() if k in Settings.__dataclass_fields__}
    if config is not None:  # "auto" decides by the size of the checkpoint named here
        chosen["gradient_checkpointing"] = checkpointing(config.train.gradient_checkpointing,
                                                         args.base)
    chosen["compute_dtype"] = resolved_dtype(args.compute_dtype)
    settings = replace(defaults, **chosen, progress=not args.no_progress)
    try:
        result = train(read_rows(args.data), args.base, args.out, settings)
    except (FileNotFoundError, ValueError) as exc:  # a missing file or an empty set: say which
        parser.exit(2, f"{prog}: {exc}\n")
    summary = {"out_dir": str(result.out_dir), "steps": result.steps, "batch": result.batch,
               "sequences": result.sequences,
               "tokens": result.tokens, "seconds": round(result.seconds, 1),
               "lr": settings.lr, "compute_dtype": settings.compute_dtype,
               "last": result.history[-1]}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
