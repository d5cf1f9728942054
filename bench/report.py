"""Benchmark of the night report: building its text and drawing its three PNG plots.

Plants NIGHTS finished nights (each with STEPS training steps, three reward sources and
FAMILIES practice families) in a real SQLite store, then times ``NightReports.build``
for the newest night: the report text, the series and the three PNGs (matplotlib Agg,
in a thread, as the bot does it). The first build includes matplotlib's import.

    .venv/bin/python bench/report.py [--nights 30] [--steps 200] [--families 4] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.config import Config  # noqa: E402
from bot.night.report import NightReports  # noqa: E402
from core.storage.store import Store  # noqa: E402


def progress(night: int, steps: int, families: int) -> dict:
    history = [{"step": s, "oapl": 1 / s, "echo": 0.2, "total": 1 / s + 0.2,
                "logratio_pos": 0.01 * math.log(s), "logratio_neg": -0.02 * math.log(s)}
               for s in range(1, steps + 1)]
    return {
        "counts": {"eligible": 90, "episodes_total": 100, "excluded:secret": 4,
                   "excluded:incomplete": 6},
        "rewards": {s: {"n": 30, "mean": math.sin(night + i) / 2, "spread": 0.3}
                    for i, s in enumerate(("verifier", "person", "judge"))},
        "judge_agreement": {"person": {"n": 20, "agree": 15, "percent": 75.0, "uncovered": 0}},
        "trained": {"steps": steps, "sequences": 64 * steps, "tokens": 10**6, "seconds": 600},
        "train_history": history,
        "gate": {"outcome": "promote", "reasons": ["ok"], "n": 40, "gain": 0.1, "lower": 0.05,
                 "upper": 0.15, "families": {f"set{f}": {"n": 10, "before": 0.3 + 0.01 * night,
                                                         "after": 0.35 + 0.01 * night}
                                             for f in range(families)}},
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--families", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Config()
        config.paths.data_dir = Path(tmp)
        store = await Store.open(config.store_path)
        try:
            for night in range(1, args.nights + 1):
                job = await store.create_job("sleep", {})
                await store.update_job(job, state="done",
                                       progress=progress(night, args.steps, args.families))
            row_bytes = len(json.dumps(progress(1, args.steps, args.families)))
            reports = NightReports(config, store)
            times = []
            for _ in range(args.runs):
                started = time.perf_counter()
                report = await reports.build()
                times.append(time.perf_counter() - started)
        finally:
            await store.close()
        sizes = {p.name: p.stat().st_size for p in report.files}
    print(f"nights {args.nights}, steps {args.steps}, families {args.families}")
    print(f"job progress per night: {row_bytes} bytes of JSON")
    print(f"report build (text + 3 PNGs): first {times[0]:.2f} s (includes matplotlib's "
          f"import), then " + ", ".join(f"{t:.2f} s" for t in times[1:]))
    print(f"report text: {len(report.text)} characters; PNG bytes: {sizes}")


if __name__ == "__main__":
    asyncio.run(main())
