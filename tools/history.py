"""The agent's undo, redo and history tools over its channel's journal (tools.journal)."""

from __future__ import annotations

import time

from tools import ToolContext, ToolError, tool
from tools.journal import Journal, JournalConflict, SnapshotTooLarge

__all__ = ["Journal", "JournalConflict", "SnapshotTooLarge", "history", "redo", "undo"]


@tool
def undo(ctx: ToolContext) -> str:
    """Revert your latest file or system-prompt change. Refuses, changing nothing, if a file
    it would touch was changed since by something else (e.g. a Python job).
    """
    return ctx.journal.undo()


@tool
def redo(ctx: ToolContext) -> str:
    """Re-apply the change you last undid. A new change after an undo clears what can be redone."""
    return ctx.journal.redo()


@tool
def history(ctx: ToolContext, limit: int = 10) -> str:
    """List your latest changes (what undo would revert next comes first) and what redo can re-apply.

    Args:
        limit: How many entries of each list to show, 1 to 50.
    """
    if not 1 <= limit <= 50:
        raise ToolError(f"limit must be between 1 and 50, got {limit}")
    done, undone = ctx.journal.log(limit)
    stamp = lambda e: time.strftime("%Y-%m-%d %H:%M", time.localtime(e.time))  # noqa: E731
    lines = ["undo would revert, newest first:"] if done else ["nothing to undo"]
    lines += [f"  #{e.id} {stamp(e)} {e.label} ({len(e.changes)} paths)" for e in done]
    if undone:
        lines.append("redo would re-apply, newest first:")
        lines += [f"  #{e.id} {stamp(e)} {e.label}" for e in undone]
    return "\n".join(lines)
