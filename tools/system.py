"""The agent's own section of its system prompt, one per channel.

The section is plain text in ``state_dir/system.md``, outside the workspace,
so only ``update_sys`` (and an admin) changes it, and every change goes
through the channel's journal: ``undo`` reverts it like a file edit. The
agent builds its system prompt with ``read_sys_section``. The section is
capped, because it is sent with every request.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from tools import ToolContext, ToolError, tool
from tools.files import numbered

SECTION_FILE = "system.md"
MAX_SECTION_CHARS = 4000


def read_sys_section(state_dir: Path) -> str:
    """The channel's section as the agent should put it into its system prompt ("" when none)."""
    # Read on every turn: plain open() on a str path costs a quarter of pathlib's
    # read_text when the file is missing, the usual case (bench/agent.py).
    try:
        with open(os.path.join(state_dir, SECTION_FILE), encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def reset_sys_section(ctx: ToolContext) -> str:
    """Remove the section (for an admin); undoable like any other change."""
    path = ctx.state_dir / SECTION_FILE
    if not path.exists():
        return "the system-prompt section is already empty"
    with ctx.journal.change("reset_sys_section") as tx:
        tx.remove(path)
    return "the system-prompt section was removed"


def _write(ctx: ToolContext, text: str, label: str) -> None:
    if len(text) > MAX_SECTION_CHARS:
        raise ToolError(f"the section would have {len(text)} characters; the limit is "
                        f"{MAX_SECTION_CHARS}. Shorten it or delete lines first")
    path = ctx.state_dir / SECTION_FILE
    with ctx.journal.change(label) as tx:
        tx.write(path, text.encode("utf-8"))


@tool
def update_sys(ctx: ToolContext, action: Literal["view", "replace", "append", "delete"],
               text: str = "", line: int = 0) -> str:
    """View or change your own section of your system prompt: notes to yourself that you will
    see in every later conversation in this channel. undo reverts a change.

    Args:
        action: view shows the section with line numbers; replace sets the whole section to
            text; append adds text as new lines at the end; delete removes line number `line`.
        text: The new text (replace, append).
        line: The line number to delete, from 1 (delete).
    """
    current = read_sys_section(ctx.state_dir)
    lines = current.splitlines()
    if action == "view":
        if not lines:
            return "your system-prompt section is empty; update_sys(action='append', text=...) adds to it"
        return f"your system-prompt section ({len(current)}/{MAX_SECTION_CHARS} characters):\n" \
               f"{numbered(lines, 1)}"
    if action == "replace":
        new = text.rstrip("\n") + "\n" if text.strip() else ""
        _write(ctx, new, "update_sys replace")
        return f"replaced the section; it now has {len(new.splitlines())} lines"
    if action == "append":
        if not text.strip():
            raise ToolError("append needs text")
        new = "".join(f"{kept}\n" for kept in lines + text.rstrip("\n").splitlines())
        _write(ctx, new, "update_sys append")
        return f"appended; the section now has {len(new.splitlines())} lines"
    if not 1 <= line <= len(lines):
        raise ToolError(f"line must be between 1 and {len(lines)} (the section has {len(lines)} "
                        f"lines), got {line}; update_sys(action='view') shows them")
    removed = lines.pop(line - 1)
    _write(ctx, "".join(f"{kept}\n" for kept in lines), f"update_sys delete line {line}")
    return f"deleted line {line}: {removed}"
