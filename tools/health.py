"""health: one compact report of the machine and the bot's services.

Memory and disk come from psutil and the workspace's file system; the
embedder, background jobs and model server are whatever the bot injected
(``ctx.embedder``, ``ctx.services.jobs``, ``ctx.status``). A service that
fails to answer is reported as such: health must work best exactly when
something is broken.
"""

from __future__ import annotations

import shutil
from typing import Any

from tools import ToolContext, tool
from tools.notes import MAX_DUPLICATE_SCAN
from tools.sizes import human_size

MAX_JOBS_SHOWN = 20


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _memory() -> str:
    import psutil

    vm = psutil.virtual_memory()
    rss = psutil.Process().memory_info().rss
    return (f"memory: {_gib(vm.available)} available of {_gib(vm.total)} ({vm.percent:.0f}% used); "
            f"this bot uses {human_size(rss)}")


def _disk(ctx: ToolContext) -> str:
    usage = shutil.disk_usage(ctx.workspace.root)
    line = f"disk: {_gib(usage.free)} free of {_gib(usage.total)} at your workspace"
    budget = ctx.services.disk
    # This channel's own use and the sums: never another channel's name or figure.
    return line if budget is None else f"{line}\ndisk budget: {budget.report(ctx.channel)}"


def _fields(item: Any) -> str:
    if isinstance(item, dict):
        return ", ".join(f"{k}={v}" for k, v in item.items())
    return str(item)


def _jobs(ctx: ToolContext) -> str:
    runner = ctx.services.jobs
    if not callable(runner):
        return "jobs: no job runner"
    try:
        jobs = list(runner())
    except Exception as exc:  # a broken job runner is a finding, not a failure of health
        return f"jobs: the job runner did not answer ({type(exc).__name__}: {exc})"
    if not jobs:
        return "jobs: no background jobs"
    lines = [f"  - {_fields(job)}" for job in jobs[:MAX_JOBS_SHOWN]]
    if len(jobs) > MAX_JOBS_SHOWN:
        lines.append(f"  [... {len(jobs) - MAX_JOBS_SHOWN} more]")
    return f"jobs: {len(jobs)}\n" + "\n".join(lines)


def _server(ctx: ToolContext) -> str:
    if not callable(ctx.status):
        return "server: no status available"
    try:
        status = ctx.status()
    except Exception as exc:  # as for jobs: report it, keep going
        return f"server: the status check failed ({type(exc).__name__}: {exc})"
    return f"server: {_fields(status)}"


def _notes(ctx: ToolContext) -> str:
    """This channel's notes only (and the shared ones when it opted in): another channel's,
    a DM's included, are not this channel's to see."""
    store = ctx.services.notes
    if store is None:
        return "notes: not enabled"
    try:
        own = store.count(ctx.channel, include_shared=False)
        duplicates = (f"{sum(len(g) - 1 for g in store.duplicate_groups(ctx.channel))} "
                      f"duplicates at similarity >= {store.duplicate_similarity}"
                      if own <= MAX_DUPLICATE_SCAN else
                      f"duplicates not counted over {MAX_DUPLICATE_SCAN} notes")
        shared = (f"; shared notes: {store.count(ctx.channel) - own}"
                  if ctx.channel in ctx.services.shared_notes_channels else "")
    except Exception as exc:  # as for jobs: report it, keep going
        return f"notes: the note store did not answer ({type(exc).__name__}: {exc})"
    return f"notes in this channel: {own} ({duplicates}){shared}"


@tool
def health(ctx: ToolContext) -> str:
    """Check the machine and the bot: free memory and disk (and this channel's use of the
    bot's disk budget), the embedder, this channel's notes (and their duplicates),
    background jobs and the model server."""
    embedder = "loaded" if ctx.embedder is not None else "not loaded (notes search is off)"
    return "\n".join([_memory(), _disk(ctx), f"embedder: {embedder}", _notes(ctx), _jobs(ctx),
                      _server(ctx)])
