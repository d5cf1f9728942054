"""The data folder's disk, measured in the background: a task owned by the runtime.

Every ``disk.refresh_s`` it measures the data folder again (``DiskBudget.refresh``) and
removes the retired practice and self-play workspaces past the kept ones
(``Workspaces.reclaim``). Both walk trees, so both run in a thread: the event loop only
ever reads the cached sums. Between two rounds the sums move with every write the bot
makes (``DiskBudget.claim``) and every poll of a running program's workspace (the
sandbox's own disk watch).
"""

from __future__ import annotations

import asyncio
import logging

from bot.periodic import every
from bot.disk.workspaces import Workspaces
from sandbox.disk_budget import DiskBudget, size_text

logger = logging.getLogger("nightshift.disk")


class DiskWatch:
    def __init__(self, budget: DiskBudget, workspaces: Workspaces, interval_s: float) -> None:
        self.budget, self.workspaces, self.interval_s = budget, workspaces, interval_s
        self._task: asyncio.Task | None = None
        self._full = False  # said once per crossing, not at every round

    async def check(self) -> None:
        removed = await asyncio.to_thread(self.workspaces.reclaim)
        if removed:
            logger.info("removed %d old practice and self-play workspaces", removed)
        total = await asyncio.to_thread(self.budget.refresh)
        full = self.budget.budget is not None and total >= self.budget.budget
        if full and not self._full:
            logger.warning("the data folder uses %s of its %s budget (disk.budget_mb): "
                           "writes are refused until files are deleted", size_text(total),
                           size_text(self.budget.budget))
        self._full = full

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(
                every(lambda: self.interval_s, self.check, "disk measurement"),
                name="disk-watch")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
