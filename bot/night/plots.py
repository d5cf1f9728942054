"""The night report's plots: the series behind them, and PNGs drawn headless.

Three plots, each from the nights' job rows (``trainer.sleep`` writes what
they need into the job's progress):

- ``rewards.png``: the mean reward of each source (verifier, person, judge)
  per night, with its spread as error bars;
- ``loss.png``: this night's loss parts (OAPL, ECHO, their total) per step,
  and below them the mean log-ratio of positive and negative messages (a
  runaway negative one is the first sign of collapse);
- ``heldout.png``: the gate's held-out score per practice family, before
  (dashed) and after (solid), across nights.

``plot_series`` is pure: it turns job rows into plain lists, and those lists
are what is drawn, so tests check the data, not the pixels. Each PNG also
carries its series as a text chunk (``nightshift-series``), so a plot can be
traced back to its numbers.

Drawing uses matplotlib's object API on the Agg canvas, never pyplot (no
global figure state, no GUI backend). It is slow and blocking (a first
import builds a font cache), so the bot calls ``render`` through
``asyncio.to_thread``; a lock keeps one render at a time, because matplotlib
does not promise thread safety. matplotlib is imported only when drawing.
"""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path
from typing import Any

SERIES_KEY = "nightshift-series"
SOURCES = ("verifier", "person", "judge")
LOSS_KEYS = ("oapl", "echo", "imitation", "total")
LOGRATIO_KEYS = ("logratio_pos", "logratio_neg")
_render_lock = threading.Lock()


def plot_series(jobs: list[dict], job_id: int) -> dict[str, Any]:
    """The three plots' data for night ``job_id``, from every night up to it."""
    nights = sorted((j for j in jobs if j["id"] <= job_id), key=lambda j: j["id"])
    this = next((j for j in nights if j["id"] == job_id), None)
    progress = (this or {}).get("progress") or {}
    return {"rewards": reward_series(nights), "loss": loss_series(progress),
            "heldout": heldout_series(nights)}


def reward_series(nights: list[dict]) -> dict:
    """Per night that has rewards: each source's mean and spread (None where absent)."""
    rated = [j for j in nights if (j.get("progress") or {}).get("rewards")]
    seen = {s for j in rated for s in j["progress"]["rewards"]}
    sources = [s for s in SOURCES if s in seen] + sorted(seen - set(SOURCES))
    out = {"nights": [j["id"] for j in rated], "sources": {}}
    for source in sources:
        stats = [j["progress"]["rewards"].get(source) or {} for j in rated]
        out["sources"][source] = {"mean": [s.get("mean") for s in stats],
                                  "spread": [s.get("spread") for s in stats],
                                  "n": [s.get("n", 0) for s in stats]}
    return out


def loss_series(progress: dict) -> dict:
    """This night's steps: loss parts and log-ratios (None where a step had none)."""
    history = progress.get("train_history") or []
    out: dict[str, list] = {"step": [h.get("step") for h in history]}
    for key in (*LOSS_KEYS, *LOGRATIO_KEYS):
        out[key] = [h.get(key) for h in history]
    if not any(v is not None for v in out["imitation"]):
        del out["imitation"]  # a night without demonstrations (or from before they were kept)
    return out


def heldout_series(nights: list[dict]) -> dict:
    """Per gated night: each family's mean held-out score before and after."""
    gated = [j for j in nights if ((j.get("progress") or {}).get("gate") or {}).get("families")]
    names = sorted({f for j in gated for f in j["progress"]["gate"]["families"]})
    out = {"nights": [j["id"] for j in gated], "families": {}}
    for name in names:
        found = [j["progress"]["gate"]["families"].get(name) or {} for j in gated]
        out["families"][name] = {"before": [f.get("before") for f in found],
                                 "after": [f.get("after") for f in found],
                                 "n": [f.get("n", 0) for f in found]}
    return out


# -- drawing ------------------------------------------------------------------------


def _nan(values: list) -> list[float]:
    """None as NaN: matplotlib leaves a gap there instead of failing."""
    return [math.nan if v is None else float(v) for v in values]


def _figure(rows: int = 1):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 3.2 * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)  # the headless Agg canvas; no pyplot, no GUI
    return figure, figure.subplots(rows, 1, squeeze=False)[:, 0]


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")


def draw_rewards(series: dict):
    figure, (ax,) = _figure()
    ax.set_title("Reward by source, per night")
    ax.set_xlabel("night")
    ax.set_ylabel("mean reward (-1..1)")
    ax.set_ylim(-1.1, 1.1)
    ax.axhline(0, color="lightgrey", linewidth=0.8)
    for source, stats in series["sources"].items():
        ax.errorbar(series["nights"], _nan(stats["mean"]),
                    yerr=[0 if s is None else s for s in stats["spread"]],
                    marker="o", capsize=3, label=source)
    if series["sources"]:
        ax.legend(loc="best", fontsize="small")
        ax.set_xticks(series["nights"])
    else:
        _empty(ax, "no rewards recorded")
    return figure


def draw_loss(series: dict):
    figure, (top, bottom) = _figure(2)
    top.set_title("Loss per step")
    bottom.set_title("Mean log-ratio (policy vs. the served model), per step")
    bottom.set_xlabel("step")
    for key in (k for k in LOSS_KEYS if k in series):
        top.plot(series["step"], _nan(series[key]), marker=".", label=key)
    for key, label in zip(LOGRATIO_KEYS, ("positive messages", "negative messages")):
        bottom.plot(series["step"], _nan(series[key]), marker=".", label=label)
    bottom.axhline(0, color="lightgrey", linewidth=0.8)
    from matplotlib.ticker import MaxNLocator

    for ax in (top, bottom):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    if series["step"]:
        top.legend(loc="best", fontsize="small")
        bottom.legend(loc="best", fontsize="small")
    else:
        _empty(top, "no training steps recorded")
    return figure


def draw_heldout(series: dict):
    figure, (ax,) = _figure()
    ax.set_title("Held-out score per family: before (dashed) and after (solid)")
    ax.set_xlabel("night")
    ax.set_ylabel("mean score (0..1)")
    ax.set_ylim(-0.05, 1.05)
    for i, (family, scores) in enumerate(series["families"].items()):
        colour = f"C{i % 10}"
        ax.plot(series["nights"], _nan(scores["before"]), linestyle="--", marker="o",
                color=colour, label=f"{family} before")
        ax.plot(series["nights"], _nan(scores["after"]), linestyle="-", marker="o",
                color=colour, label=f"{family} after")
    if series["families"]:
        ax.legend(loc="best", fontsize="small")
        ax.set_xticks(series["nights"])
    else:
        _empty(ax, "no gate scores recorded")
    return figure


DRAW = {"rewards": draw_rewards, "loss": draw_loss, "heldout": draw_heldout}


def render(series: dict[str, Any], folder: Path) -> list[Path]:
    """Draw each plot to ``folder/<name>.png`` (written whole, then renamed); blocking."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    with _render_lock:
        for name, draw in DRAW.items():
            figure = draw(series[name])
            path = folder / f"{name}.png"
            partial = path.with_name(path.name + ".partial")
            figure.savefig(partial, format="png",
                           metadata={SERIES_KEY: json.dumps(series[name], sort_keys=True)})
            os.replace(partial, path)
            paths.append(path)
    return paths
