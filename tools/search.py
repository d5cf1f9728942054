"""Search tools: grep, glob, file_info, tree and outline.

grep and outline work on the agent's bytes in a sealed worker process under limits
(``tools.worker``): a pattern that backtracks without end, or a file whose
syntax tree takes gigabytes, stops there with a clear error and never holds
the bot's GIL. grep's worker gets the file or folder already opened through
the jail, as a descriptor; outline's gets the bytes (at most 1 MiB). The
work itself is in ``tools.parsers``.

Walks go through folder descriptors (``os.fwalk``, ``O_NOFOLLOW`` opens), so
they never follow a link, even one a job swaps in mid-walk: a link could lead
out of the workspace or into a loop. Version-control and cache folders are
skipped. Every listing is capped, with a note saying what was left out and
how to narrow the search.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import time

from tools import ToolContext, ToolError, tool, worker
from tools.files import existing, is_binary, open_dir, open_file, rel, resolve_no_follow, scan
from tools.fsroot import DIR_FLAGS, FsRoot
from tools.parsers import SKIPPED_DIRS, walk
from tools.programs import sandbox_of

MAX_GLOB_RESULTS = 200
MAX_GLOB_PARTS = 32  # folder levels a pattern may name (repeated ** count once)
MAX_TREE_LINES = 300
MAX_PATTERN_CHARS = 1000
# A real Python file is rarely over 1 MiB; its syntax tree takes about 400 bytes per byte.
MAX_OUTLINE_BYTES = 1024 * 1024
GREP_LIMITS = worker.Limits(memory_mb=512, cpu_s=10, timeout_s=15)
OUTLINE_LIMITS = worker.Limits(memory_mb=1024, cpu_s=10, timeout_s=15)


@tool
def grep(ctx: ToolContext, pattern: str, path: str = ".", glob: str = "*") -> str:
    """Search file contents for a Python regular expression; shows file:line: text for each match.

    Args:
        pattern: A Python regular expression, e.g. "def \\w+" or "TODO".
        path: The file or folder to search, relative to your workspace.
        glob: Only search files whose name or relative path matches this pattern, e.g. "*.py".
    """
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ToolError(f"the pattern is {len(pattern)} characters long; the limit is "
                        f"{MAX_PATTERN_CHARS}")
    target = existing(ctx, path)
    box = sandbox_of(ctx)
    # Opened here, through the jail; the worker only gets the descriptor.
    fd = open_dir(ctx, path) if target.is_dir() else ctx.workspace.open(path)
    try:
        folder = stat.S_ISDIR(os.fstat(fd).st_mode)
        if folder:  # the worker walks it as the sandbox user, who must be able to enter it
            worker.prepare_folder(ctx.workspace.root, box)
        args = {"pattern": pattern, "path": path, "glob": glob, "fd": fd, "folder": folder,
                "base": rel(ctx, target)}
        return worker.run("grep", args, fds=(fd,), limits=GREP_LIMITS, box=box,
                          what=f"grep for {pattern!r} in {path}",
                          hint="the pattern may backtrack without end (nested repeats such as "
                               "(a+)+ or (.*)*); simplify it, or narrow path or glob")
    finally:
        os.close(fd)


@tool
def glob(ctx: ToolContext, pattern: str) -> str:
    """Find files and folders whose workspace-relative path matches a pattern: * matches within
    one folder name, ** any number of folders, e.g. "**/*.py" or "data/*.csv".

    Args:
        pattern: The pattern, relative to your workspace.
    """
    parts = [p for p in pattern.strip().split("/") if p not in ("", ".")]
    if pattern.startswith("/") or ".." in parts:
        raise ToolError(f"the pattern must be relative to your workspace, without '..': {pattern!r}")
    if not parts:
        raise ToolError("the pattern is empty; try '*' or '**/*.py'")
    # "**/**" matches what "**" does: collapsed, so repeats cost nothing.
    parts = [p for i, p in enumerate(parts) if not (p == "**" and i and parts[i - 1] == "**")]
    if len(parts) > MAX_GLOB_PARTS:
        raise ToolError(f"the pattern has {len(parts)} parts; at most {MAX_GLOB_PARTS}")
    found: list[str] = []
    dir_fd = ctx.workspace.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for folder, dirs, files, _ in walk(dir_fd):
            for name, suffix in [(d, "/") for d in dirs] + [(f, "") for f in files]:
                path = f"{folder}/{name}" if folder else name
                if _match(path.split("/"), parts):
                    found.append(path + suffix)
    finally:
        os.close(dir_fd)
    if not found:
        return f"nothing matches {pattern!r}"
    found.sort()
    more = len(found) - MAX_GLOB_RESULTS
    tail = f"\n[... {more} more; narrow the pattern]" if more > 0 else ""
    return "\n".join(found[:MAX_GLOB_RESULTS]) + tail


def _match(names: list[str], parts: list[str]) -> bool:
    """Whether path components match pattern components, with ** spanning any number of
    them. One pass over the names, keeping the set of pattern positions reached: at most
    len(names) x len(parts) comparisons, where trying every split of each ** was
    exponential in their number (40 of them on a 10-deep tree never returned)."""
    def closed(reached: set[int]) -> set[int]:  # a ** may match no folder at all
        for j in sorted(reached):
            while j < len(parts) and parts[j] == "**":
                j += 1
                reached.add(j)
        return reached

    reached = closed({0})
    for name in names:
        after = set()
        for j in reached:
            if j == len(parts):
                continue
            if parts[j] == "**":
                after.add(j)  # it takes this folder too, and may take more
            elif fnmatch.fnmatchcase(name, parts[j]):
                after.add(j + 1)
        reached = closed(after)
        if not reached:
            return False
    return len(parts) in reached


@tool
def file_info(ctx: ToolContext, path: str) -> str:
    """Tell a path's type, size, modification time and, for a text file, its line count.

    Args:
        path: The file, folder or link, relative to your workspace.
    """
    target = resolve_no_follow(ctx, path)
    fs, name = FsRoot(ctx.workspace.root), rel(ctx, target)
    st = fs.lstat(name)
    if st is None:
        raise ToolError(f"{path} does not exist; list_dir shows what is there")
    modified = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st.st_mtime))
    if stat.S_ISLNK(st.st_mode):
        return f"{path}: link to {fs.readlink(name)}, modified {modified}"
    if stat.S_ISDIR(st.st_mode):
        return f"{path}: folder with {len(fs.listdir(name))} entries, modified {modified}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path}: special file (not a regular file), modified {modified}"
    with open_file(ctx, path) as f:
        binary = is_binary(f.read(8192))
        lines = ""
        if not binary and st.st_size <= 50 * 2**20:
            f.seek(0)
            lines = f", {sum(1 for _ in f)} lines"
    kind = "binary file" if binary else "text file"
    return f"{path}: {kind}, {st.st_size} bytes{lines}, modified {modified}"


@tool
def tree(ctx: ToolContext, path: str = ".", depth: int = 2) -> str:
    """Show the folder structure below a folder, as an indented tree.

    Args:
        path: The folder to start from, relative to your workspace.
        depth: How many levels of folders to show, 1 to 6.
    """
    if not 1 <= depth <= 6:
        raise ToolError(f"depth must be between 1 and 6, got {depth}")
    dir_fd = open_dir(ctx, path)
    lines = [f"{path.rstrip('/') or '.'}/"]
    try:
        cut = _tree_lines(dir_fd, depth, 1, lines)
    finally:
        os.close(dir_fd)
    if cut:
        lines.append(f"[... cut at {MAX_TREE_LINES} lines; show a subfolder or lower depth]")
    return "\n".join(lines)


def _tree_lines(dir_fd: int, depth: int, level: int, lines: list[str]) -> bool:
    """Append the entries of the open folder to ``lines``; True when the cap cut them."""
    for entry in scan(dir_fd):
        if len(lines) >= MAX_TREE_LINES:
            return True
        indent = "  " * level
        if entry.is_symlink():
            lines.append(f"{indent}{entry.name} -> {os.readlink(entry.name, dir_fd=dir_fd)}")
        elif entry.is_dir(follow_symlinks=False):
            skipped = entry.name in SKIPPED_DIRS
            lines.append(f"{indent}{entry.name}/" + ("  (not shown)" if skipped else ""))
            if level < depth and not skipped:
                child = os.open(entry.name, DIR_FLAGS, dir_fd=dir_fd)
                try:
                    if _tree_lines(child, depth, level + 1, lines):
                        return True
                finally:
                    os.close(child)
        else:
            lines.append(f"{indent}{entry.name}")
    return False


@tool
def outline(ctx: ToolContext, path: str) -> str:
    """List the classes and functions of a Python file with their line ranges and signatures.

    Args:
        path: The .py file, relative to your workspace.
    """
    target = existing(ctx, path)
    if target.is_dir() or target.suffix != ".py":
        raise ToolError(f"outline reads Python files (.py); {path} is not one. grep or read_file "
                        f"work on other files")
    with open_file(ctx, path) as f:
        size = os.fstat(f.fileno()).st_size
        source = f.read(MAX_OUTLINE_BYTES + 1)
    if len(source) > MAX_OUTLINE_BYTES:
        raise ToolError(f"{path} is {max(size, len(source)) / 2**20:.1f} MiB; outline reads Python "
                        f"files up to {MAX_OUTLINE_BYTES // 2**20} MiB. grep for '^\\s*(def|class) ' "
                        "finds the definitions instead")
    return worker.run("outline", {"path": path}, source, limits=OUTLINE_LIMITS,
                      box=sandbox_of(ctx), what=f"outlining {path}",
                      hint="grep for '^\\s*(def|class) ' finds the definitions instead")
