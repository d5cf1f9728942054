"""File tools: read, write, edit, list, make folders, delete, clear scratch.

Every path goes through the channel's workspace jail (``Workspace.resolve``),
and every change goes through the channel's journal, so it can be undone.
Outputs are bounded: ``read_file`` pages 100 lines at a time, long lines and
long listings are cut with a note saying so.
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path
from typing import Literal

from tools import ToolContext, ToolError, tool
from tools.filelocks import locked
from tools.journal import SnapshotTooLarge

PAGE_LINES = 100
MAX_LINE_CHARS = 2000
MAX_LIST_ENTRIES = 300
MAX_EDIT_BYTES = 10 * 1024 * 1024
SNIPPET_CONTEXT = 2


# --- shared helpers (search.py uses them too) ---


def resolve(ctx: ToolContext, path: str) -> Path:
    """The path inside the workspace; PathEscape (a ValueError) when it leads out."""
    return ctx.workspace.resolve(path)


def existing(ctx: ToolContext, path: str) -> Path:
    target = resolve(ctx, path)
    if not target.exists():
        raise ToolError(f"{path} does not exist; list_dir shows what is there")
    return target


def rel(ctx: ToolContext, path: Path) -> str:
    """The workspace-relative name of a path already inside the workspace (links not followed)."""
    return Path(os.path.relpath(path, ctx.workspace.root.resolve())).as_posix()


def resolve_no_follow(ctx: ToolContext, path: str) -> Path:
    """Like ``resolve``, but a link as the last component stays the link, not its target.

    Deleting a link must remove the link, never what it points to; a link
    leading out of the workspace may be inspected and deleted, not followed.
    """
    try:
        resolved, refusal = resolve(ctx, path), None
    except ValueError as exc:  # PathEscape: re-raised below unless the path names a link
        resolved, refusal = None, exc
    parent, name = posixpath.split(path.rstrip("/"))
    if name not in ("", ".", ".."):
        try:
            candidate = resolve(ctx, parent or ".") / name
        except ValueError:
            candidate = None
        if candidate is not None and candidate.is_symlink():
            return candidate
    if refusal is not None:
        raise refusal
    return resolved


def is_binary(head: bytes) -> bool:
    return b"\0" in head


def open_file(ctx: ToolContext, path: str):
    """A workspace file opened for binary reading without following any link on the way.

    ``Workspace.open`` closes the gap between the jail's check and the open,
    in which a job could swap a folder for a link to the host.
    """
    fd = ctx.workspace.open(path)
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise ToolError(f"{path} is a folder; list_dir shows its contents")
    return os.fdopen(fd, "rb")


def open_dir(ctx: ToolContext, path: str) -> int:
    """A descriptor of a workspace folder, opened without following any link on the way."""
    if not existing(ctx, path).is_dir():
        raise ToolError(f"{path} is a file, not a folder; read_file or file_info tell more")
    return ctx.workspace.open(path, os.O_RDONLY | os.O_DIRECTORY)


def scan(dir_fd: int) -> list[os.DirEntry]:
    """A folder's entries, folders first, then by name."""
    with os.scandir(dir_fd) as it:
        return sorted(it, key=lambda e: (not e.is_dir(follow_symlinks=False), e.name))


def read_text(ctx: ToolContext, path: str) -> str:
    """A text file's content for editing; refuses folders, binary and non-UTF-8 files."""
    with open_file(ctx, path) as f:
        if os.fstat(f.fileno()).st_size > MAX_EDIT_BYTES:
            raise ToolError(f"{path} is larger than {MAX_EDIT_BYTES // 2**20} MiB; too large to edit here")
        data = f.read()
    if is_binary(data[:8192]):
        raise ToolError(f"{path} is a binary file ({len(data)} bytes); only text files can be edited")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(f"{path} is not UTF-8 text (bad byte at {exc.start}); it cannot be edited") from None


def numbered(lines: list[str], first: int) -> str:
    out = []
    for number, line in enumerate(lines, first):
        line = line.rstrip("\r\n")
        if len(line) > MAX_LINE_CHARS:
            line = f"{line[:MAX_LINE_CHARS]} [... line cut, {len(line) - MAX_LINE_CHARS} more characters]"
        out.append(f"{number:>6}\t{line}")
    return "\n".join(out)


# --- tools ---


@tool
def read_file(ctx: ToolContext, path: str, offset: int = 1, limit: int = PAGE_LINES) -> str:
    """Read a text file with numbered lines, at most 100 lines per call.

    Args:
        path: The file, relative to your workspace.
        offset: The first line to show (1 = the start of the file).
        limit: How many lines to show, 1 to 100.
    """
    existing(ctx, path)
    if offset < 1:
        raise ToolError(f"offset must be 1 or more (lines are numbered from 1), got {offset}")
    if limit < 1:
        raise ToolError(f"limit must be between 1 and {PAGE_LINES}, got {limit}")
    limit = min(limit, PAGE_LINES)
    shown: list[str] = []
    total = 0
    with open_file(ctx, path) as f:
        if is_binary(f.read(8192)):
            raise ToolError(f"{path} is a binary file ({os.fstat(f.fileno()).st_size} bytes); "
                            f"read_file shows text only. file_info tells its size and type")
        f.seek(0)
        for total, raw in enumerate(f, 1):
            if offset <= total < offset + limit:
                shown.append(raw.decode("utf-8", errors="replace"))
    if total == 0:
        return f"{path} is empty (0 lines)"
    if offset > total:
        raise ToolError(f"offset {offset} is past the end: {path} has {total} lines")
    last = offset + len(shown) - 1
    header = f"{path}: lines {offset}-{last} of {total}"
    if last < total:
        footer = f"({total - last} more lines; read on with read_file(path={path!r}, offset={last + 1}))"
    else:
        footer = "(end of file)"
    return f"{header}\n{numbered(shown, offset)}\n{footer}"


@tool
def write_file(ctx: ToolContext, path: str, content: str) -> str:
    """Create or overwrite a text file with the given content; missing parent folders are created.

    Args:
        path: The file, relative to your workspace.
        content: The whole new content of the file.
    """
    target = resolve(ctx, path)
    if target.is_dir():
        raise ToolError(f"{path} is a folder; choose a file name inside it")
    existed = target.exists()
    data = content.encode("utf-8")
    with locked(ctx, target), ctx.journal.change(f"write_file {rel(ctx, target)}") as tx:
        tx.write(target, data)
    lines = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
    return f"{'overwrote' if existed else 'created'} {path} ({lines} lines, {len(data)} bytes)"


@tool
def edit_file(ctx: ToolContext, path: str,
              mode: Literal["replace_lines", "insert", "delete_lines", "replace_text"],
              start: int | None = None, end: int | None = None, after: int | None = None,
              text: str | None = None, old: str | None = None, new: str | None = None) -> str:
    """Edit a text file in place. Modes: replace_lines (start, end, text) replaces lines start..end
    with text; insert (after, text) inserts text after line `after` (0 = at the top);
    delete_lines (start, end) deletes lines start..end; replace_text (old, new) replaces the
    exact text `old`, which must occur exactly once, with `new`.

    Args:
        path: The file, relative to your workspace.
        mode: Which kind of edit: replace_lines, insert, delete_lines or replace_text.
        start: First line of the range, counting from 1 (replace_lines, delete_lines).
        end: Last line of the range, inclusive (replace_lines, delete_lines).
        after: Insert after this line; 0 inserts at the top (insert).
        text: The new lines (replace_lines, insert).
        old: The exact text to find, including whitespace (replace_text).
        new: The text to put in its place; may be empty (replace_text).
    """
    needs = {"replace_lines": ("start", "end", "text"), "insert": ("after", "text"),
             "delete_lines": ("start", "end"), "replace_text": ("old", "new")}[mode]
    given = {"start": start, "end": end, "after": after, "text": text, "old": old, "new": new}
    missing = [name for name in needs if given[name] is None]
    if missing:
        raise ToolError(f"mode {mode!r} needs {', '.join(needs)}; missing: {', '.join(missing)}")
    target = existing(ctx, path)
    with locked(ctx, target):  # read, change and write as one step in a shared workspace
        content = read_text(ctx, path)
        if mode == "replace_text":
            new_content, first, count = _replace_text(content, old, new, path)
        else:
            new_content, first, count = _edit_lines(content, mode, start, end, after, text, path)
        with ctx.journal.change(f"edit_file {rel(ctx, target)} ({mode})") as tx:
            tx.write(target, new_content.encode("utf-8"))
    lines = new_content.splitlines(keepends=True)
    lo = max(1, first - SNIPPET_CONTEXT)
    hi = min(len(lines), first + max(count, 1) - 1 + SNIPPET_CONTEXT, lo + 29)
    snippet = numbered(lines[lo - 1:hi], lo) if lines else "(the file is now empty)"
    return f"edited {path} ({mode}); it now has {len(lines)} lines. Lines {lo}-{hi}:\n{snippet}"


def _replace_text(content: str, old: str, new: str, path: str) -> tuple[str, int, int]:
    if not old:
        raise ToolError("old must not be empty; to add text use insert")
    found = content.count(old)
    if found != 1:
        hint = ("check the exact whitespace and line breaks, or read_file to copy it"
                if found == 0 else "include more surrounding text so it occurs once")
        raise ToolError(f"old occurs {found} times in {path}, it must occur exactly once; {hint}")
    index = content.index(old)
    first = content.count("\n", 0, index) + 1
    return content.replace(old, new, 1), first, new.count("\n") + 1


def _edit_lines(content: str, mode: str, start: int | None, end: int | None, after: int | None,
                text: str | None, path: str) -> tuple[str, int, int]:
    """The new content, the first changed line and how many lines the edit put there."""
    lines = content.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    n = len(lines)
    if mode == "insert":
        if not 0 <= after <= n:
            raise ToolError(f"after must be between 0 and {n} ({path} has {n} lines), got {after}")
        start, end = after + 1, after  # an empty range just after `after`
    elif not 1 <= start <= end <= n:
        raise ToolError(f"need 1 <= start <= end <= {n} ({path} has {n} lines), got start={start}, "
                        f"end={end}")
    block = []
    if text is not None:
        block = [line.rstrip("\r\n") + newline for line in text.splitlines()]
    if block and end == n and lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += newline  # the old last line now has lines after it
    lines[start - 1:end] = block
    return "".join(lines), start, len(block)


@tool
def list_dir(ctx: ToolContext, path: str = ".") -> str:
    """List a folder: subfolders end with '/', files show their size.

    Args:
        path: The folder, relative to your workspace; "." is the workspace itself.
    """
    dir_fd = open_dir(ctx, path)
    try:
        entries = scan(dir_fd)
        out = []
        for entry in entries[:MAX_LIST_ENTRIES]:
            if entry.is_symlink():
                out.append(f"{entry.name} -> {os.readlink(entry.name, dir_fd=dir_fd)}")
            elif entry.is_dir(follow_symlinks=False):
                out.append(f"{entry.name}/")
            else:
                out.append(f"{entry.name}  ({entry.stat(follow_symlinks=False).st_size} bytes)")
    finally:
        os.close(dir_fd)
    if not entries:
        return f"{path} is empty"
    if len(entries) > MAX_LIST_ENTRIES:
        out.append(f"[... {len(entries) - MAX_LIST_ENTRIES} more entries; glob narrows the list]")
    return f"{path} ({len(entries)} entries):\n" + "\n".join(out)


@tool
def make_dir(ctx: ToolContext, path: str) -> str:
    """Create a folder, and any missing parent folders.

    Args:
        path: The folder to create, relative to your workspace.
    """
    target = resolve(ctx, path)
    if target.is_dir():
        return f"{path} already exists"
    if target.exists():
        raise ToolError(f"{path} is a file; a folder cannot take its place")
    with ctx.journal.change(f"make_dir {rel(ctx, target)}") as tx:
        tx.mkdir(target)
    return f"created folder {path}"


@tool
def delete(ctx: ToolContext, path: str) -> str:
    """Delete a file, a link or a whole folder with everything in it (undo brings it back).

    Args:
        path: What to delete, relative to your workspace.
    """
    target = resolve_no_follow(ctx, path)
    if target == ctx.workspace.root:
        raise ToolError("the workspace itself cannot be deleted; delete what is inside it")
    if not os.path.lexists(target):
        raise ToolError(f"{path} does not exist; list_dir shows what is there")
    with ctx.journal.change(f"delete {rel(ctx, target)}") as tx:
        tx.remove(target)
    return f"deleted {path}"


@tool
def clear_scratch(ctx: ToolContext) -> str:
    """Empty your scratch/ folder, the place for temporary files."""
    scratch = resolve(ctx, "scratch")  # the jail refuses a scratch/ replaced by a link out
    children = sorted(scratch.iterdir()) if scratch.is_dir() else []
    if not children:
        return "scratch/ is already empty"
    try:
        with ctx.journal.change("clear_scratch") as tx:
            for child in children:
                tx.touch(child)  # all snapshots first: a too-large one must stop before any removal
            for child in children:
                tx.remove(child)
    except SnapshotTooLarge:
        # Too big to keep a copy of: scratch is throwaway space, so clear it anyway.
        ctx.workspace.clear_scratch()
        return (f"emptied scratch/ ({len(children)} entries); it was too large to keep a copy of, "
                f"so undo cannot bring it back")
    return f"emptied scratch/ ({len(children)} entries; undo brings them back)"
