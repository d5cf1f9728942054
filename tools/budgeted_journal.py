"""A channel's journal whose writes also answer to the data folder's budget.

``tools.journal`` checks each write against the workspace's quota. Every file tool writes
through a journal ``Transaction`` (write_file, edit_file, update_sys, ...), so that is
the one place a write can also be checked against the data folder's budget and the
channel's and its owner's shares (``sandbox.disk_budget``); the journal itself stays
free of budgets (and under its size limit). A refused write raises ``DiskFull`` before
anything is written, so the file, the journal and the undo history stay as they were.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from sandbox.disk_budget import DiskBudget, blocks
from tools.journal import Journal, Transaction


class BudgetedJournal(Journal):
    def __init__(self, state_dir: Path, workspace_root: Path, *, budget: DiskBudget,
                 channel: str, **options: Any) -> None:
        super().__init__(state_dir, workspace_root, **options)
        self.budget, self.channel = budget, channel

    def change(self, label: str) -> Transaction:
        return _BudgetedTransaction(self, label)


class _BudgetedTransaction(Transaction):
    journal: BudgetedJournal

    def _check_quota(self, path: Path, size: int) -> None:
        super()._check_quota(path, size)  # the workspace's own quota first
        try:
            info = os.lstat(path)
            old = info.st_blocks * 512 if stat.S_ISREG(info.st_mode) else 0
        except OSError:
            old = 0
        self.journal.budget.claim(path, blocks(size) - old, self.journal.channel)
