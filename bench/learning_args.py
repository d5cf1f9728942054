"""bench/learning.py's command line: every flag, its default and what it sets."""

from __future__ import annotations

import argparse
from pathlib import Path

from core.config import Config
from families import FAMILIES
from trainer.losses import IMITATION_PER

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_HF = ROOT / "data/models/smollm2-135m-instruct-hf"
# The families of the README's current figure; "last" (added after it was measured) is
# asked for by name: its own figure is in docs/learning.md.
DEFAULT_FAMILIES = ["arithmetic", "protocol", "compare", "tool"]


def arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", type=Path, default=DEFAULT_HF, help="the HF checkpoint")
    parser.add_argument("--gguf", help="the GGUF served (its conversion of --model)")
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES),
                        help=f"default: {' '.join(DEFAULT_FAMILIES)} (the README's figure)")
    parser.add_argument("--train", type=int, default=16, help="practised items a family")
    parser.add_argument("--held", type=int, default=40, help="held-out items a family")
    parser.add_argument("--samples", type=int, default=4, help="attempts per practised item")
    parser.add_argument("--mixed-samples", type=int,
                        help="practice.mixed_samples: attempts in all for an item whose first "
                             "attempts disagree (default: the config's; 0 = off)")
    parser.add_argument("--first-attempts", type=int,
                        help="with --day: train on each practice group's first G attempts "
                             "only (a day practised with --mixed-samples, as if without)")
    parser.add_argument("--temperature", type=float, default=0.8, help="practice temperature")
    parser.add_argument("--max-steps", type=int, default=Config().agent.max_steps,
                        help="agent.max_steps")
    parser.add_argument("--context", type=int, default=Config().model.context_tokens,
                        help="model.context_tokens (and train.max_tokens)")
    parser.add_argument("--epochs", type=int), parser.add_argument("--lr", type=float)
    parser.add_argument("--beta", type=float)
    parser.add_argument("--compute-dtype", choices=["auto", "float32", "bfloat16"],
                        help="train.compute_dtype (the training's matrix products)")
    parser.add_argument("--schedule", choices=["constant", "linear", "cosine"],
                        help="train.schedule (the learning rate over the steps)")
    parser.add_argument("--warmup-steps", type=int, help="train.warmup_steps")
    parser.add_argument("--imitation", type=float, help="train.imitation (the demonstrations' weight)")
    parser.add_argument("--imitation-per", choices=IMITATION_PER,
                        help="train.imitation_per: what the demonstrations' loss averages over")
    parser.add_argument("--imitate-known-choices", action=argparse.BooleanOptionalAction,
                        help="train.imitate_known_choices: also imitate a reference's choice "
                             "under the tool list that most attempts of its group made too")
    parser.add_argument("--imitate-known-passing-choices", action=argparse.BooleanOptionalAction,
                        help="train.imitate_known_passing_choices: the same for a passing "
                             "attempt imitated beside OAPL (night.imitate_passing)")
    parser.add_argument("--imitate-passing", action=argparse.BooleanOptionalAction,
                        help="night.imitate_passing: also imitate a mixed group's passing "
                             "attempts (default: the config's, on)")
    parser.add_argument("--anchor-demonstrated", action=argparse.BooleanOptionalAction,
                        help="night.anchor_demonstrated: hold one failed attempt of a group "
                             "shown by its reference at advantage 0 (default: the config's, on)")
    parser.add_argument("--min-steps", type=int, help="train.min_steps")
    parser.add_argument("--max-epochs", type=int, help="train.max_epochs: the most passes "
                        "over the night's data that min_steps may repeat it to")
    parser.add_argument("--stop-split", type=float,
                        help="train.stop_split: the share of mixed practice groups held out "
                             "to stop the night on evidence (0 = off)")
    parser.add_argument("--stop-every", type=int, help="train.stop_every (steps between checks)")
    parser.add_argument("--batch", type=int, help="train.batch (sequences per optimizer step)")
    parser.add_argument("--practice-steps", type=int,
                        help="practice.max_steps (default: its default, at most --max-steps)")
    parser.add_argument("--chat-format", default=Config().model.chat_format,
                        help="model.chat_format (plain chatml offers no tool calls)")
    parser.add_argument("--tools", nargs="*", default=[],
                        help="agent.tools: the tools offered (default: auto, the product's)")
    parser.add_argument("--days", type=int, help="independent fresh days (default 3; 1 with "
                        "--quick): other items and practice, the same settings")
    parser.add_argument("--nights", type=int, default=1, help="nights a day, chained: night k "
                        "practises new items of the same families on top of night k-1, and "
                        "answers the same held-out items")
    parser.add_argument("--seed", type=int, default=0, help="day i draws its items with "
                        "seed + i")
    parser.add_argument("--night-timeout", type=float, default=3600.0)
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it, with "
                        "a copy of the day before the night (for --day)")
    parser.add_argument("--day", type=Path, nargs="+", help="skip the day: take the held-out "
                        "answers before and the practice from directories kept by --keep (same "
                        "families, items and seed), run only the night and the answers after on "
                        "each, and compare with the night kept before there (pooled over days)")
    parser.add_argument("--against", type=int, metavar="N", help="with --day: compare with "
                        "the night kept there as number N (the -N ending its file in DIR/nights) "
                        "instead of the last one, e.g. a default night against later variants (with "
                        "--versus: the night of the --versus days)")
    parser.add_argument("--quick", action="store_true", help="3 train / 2 held-out, 2 samples")
    parser.add_argument("--tabulate", type=Path, nargs="+", help="run nothing: print the table "
                        "of days kept by --keep (DIR/day-i), each with its own first night, so "
                        "that a run cut short still gives its figure")
    parser.add_argument("--night", type=int, nargs="+", metavar="N", help="with --tabulate: "
                        "each day's night kept as number N (the -N ending its file in "
                        "DIR/nights) instead of its first, e.g. a later setting's nights rerun "
                        "with --day (not --nights, which chains nights); one N a day, in the "
                        "order of --tabulate, where the days kept it under different numbers")
    parser.add_argument("--versus", type=Path, nargs="+", metavar="DIR", help="with "
                        "--tabulate: also compare each tabulated day's night, item by item, "
                        "with the night of the matching day here (another setting's days, "
                        "kept with the same --seed; --against N picks its night, else the "
                        "first), pooled over the days")
    return parser
