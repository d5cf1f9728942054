"""Search tools: grep, glob, file_info, tree and outline.

Walks never follow links (a link could lead out of the workspace or into a
loop) and skip version-control and cache folders. Every listing is capped,
with a note saying what was left out and how to narrow the search.
"""

from __future__ import annotations

import ast
import fnmatch
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from tools import ToolContext, ToolError, tool
from tools.files import existing, is_binary, lexical, rel

MAX_MATCHES = 100
MAX_GLOB_RESULTS = 200
MAX_TREE_LINES = 300
MAX_OUTLINE_LINES = 300
MAX_GREP_FILE_BYTES = 5 * 1024 * 1024
MATCH_PREVIEW_CHARS = 200
SKIPPED_DIRS = {".git", "__pycache__", ".venv", "node_modules", ".mypy_cache", ".pytest_cache"}


def walk_files(top: Path) -> Iterator[Path]:
    """Regular files below ``top`` in sorted order, links and skipped folders left out."""
    for folder, dirs, files in os.walk(top, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            path = Path(folder) / name
            if not path.is_symlink():
                yield path


@tool
def grep(ctx: ToolContext, pattern: str, path: str = ".", glob: str = "*") -> str:
    """Search file contents for a Python regular expression; shows file:line: text for each match.

    Args:
        pattern: A Python regular expression, e.g. "def \\w+" or "TODO".
        path: The file or folder to search, relative to your workspace.
        glob: Only search files whose name or relative path matches this pattern, e.g. "*.py".
    """
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from None
    target = existing(ctx, path)
    files = [target] if target.is_file() else walk_files(target)
    matches: list[str] = []
    searched = 0
    for file in files:
        name = rel(ctx, file)
        if not (fnmatch.fnmatch(file.name, glob) or fnmatch.fnmatch(name, glob)):
            continue
        if file.stat().st_size > MAX_GREP_FILE_BYTES:
            continue
        data = file.read_bytes()
        if is_binary(data[:8192]):
            continue
        searched += 1
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if regex.search(line):
                preview = line.strip()
                if len(preview) > MATCH_PREVIEW_CHARS:
                    preview = preview[:MATCH_PREVIEW_CHARS] + " [...]"
                matches.append(f"{name}:{number}: {preview}")
                if len(matches) >= MAX_MATCHES:
                    return "\n".join(matches) + (f"\n[stopped after {MAX_MATCHES} matches; narrow "
                                                 f"the pattern, path or glob]")
    if not matches:
        return f"no matches for {pattern!r} in {searched} text files under {path} (glob {glob!r})"
    return "\n".join(matches) + f"\n({len(matches)} matches in {searched} files searched)"


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
    root = ctx.workspace.root.resolve()
    found: list[str] = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        base = Path(folder).relative_to(root).as_posix()
        for name, suffix in [(d, "/") for d in dirs] + [(f, "") for f in sorted(files)]:
            path = f"{base}/{name}" if base != "." else name
            if _match(path.split("/"), parts):
                found.append(path + suffix)
    if not found:
        return f"nothing matches {pattern!r}"
    found.sort()
    more = len(found) - MAX_GLOB_RESULTS
    tail = f"\n[... {more} more; narrow the pattern]" if more > 0 else ""
    return "\n".join(found[:MAX_GLOB_RESULTS]) + tail


def _match(names: list[str], parts: list[str]) -> bool:
    """Whether path components match pattern components, with ** spanning any number of them."""
    if not parts:
        return not names
    if parts[0] == "**":
        return any(_match(names[i:], parts[1:]) for i in range(len(names) + 1))
    return bool(names) and fnmatch.fnmatchcase(names[0], parts[0]) and _match(names[1:], parts[1:])


@tool
def file_info(ctx: ToolContext, path: str) -> str:
    """Tell a path's type, size, modification time and, for a text file, its line count.

    Args:
        path: The file, folder or link, relative to your workspace.
    """
    target = lexical(ctx, path)
    if not os.path.lexists(target):
        raise ToolError(f"{path} does not exist; list_dir shows what is there")
    st = target.lstat()
    modified = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st.st_mtime))
    if target.is_symlink():
        return f"{path}: link to {os.readlink(target)}, modified {modified}"
    if target.is_dir():
        return f"{path}: folder with {len(os.listdir(target))} entries, modified {modified}"
    with open(target, "rb") as f:
        binary = is_binary(f.read(8192))
    kind = "binary file" if binary else "text file"
    lines = ""
    if not binary and st.st_size <= 50 * 2**20:
        with open(target, "rb") as f:
            lines = f", {sum(1 for _ in f)} lines"
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
    target = existing(ctx, path)
    if not target.is_dir():
        raise ToolError(f"{path} is a file, not a folder")
    lines = [f"{path.rstrip('/') or '.'}/"]
    cut = _tree_lines(target, depth, 1, lines)
    if cut:
        lines.append(f"[... cut at {MAX_TREE_LINES} lines; show a subfolder or lower depth]")
    return "\n".join(lines)


def _tree_lines(folder: Path, depth: int, level: int, lines: list[str]) -> bool:
    """Append the entries of ``folder`` to ``lines``; True when the cap cut them."""
    entries = sorted(os.scandir(folder), key=lambda e: (not e.is_dir(follow_symlinks=False), e.name))
    for entry in entries:
        if len(lines) >= MAX_TREE_LINES:
            return True
        indent = "  " * level
        if entry.is_symlink():
            lines.append(f"{indent}{entry.name} -> {os.readlink(entry.path)}")
        elif entry.is_dir():
            skipped = entry.name in SKIPPED_DIRS
            lines.append(f"{indent}{entry.name}/" + ("  (not shown)" if skipped else ""))
            if level < depth and not skipped and _tree_lines(Path(entry.path), depth, level + 1, lines):
                return True
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
    source = target.read_bytes()
    try:
        module = ast.parse(source, filename=path)
    except SyntaxError as exc:
        where = f"line {exc.lineno}, column {exc.offset}" if exc.lineno else "an unknown line"
        text = f": {exc.text.strip()}" if exc.text else ""
        raise ToolError(f"{path} has a syntax error at {where}: {exc.msg}{text}") from None
    except ValueError as exc:  # e.g. null bytes
        raise ToolError(f"{path} cannot be parsed as Python: {exc}") from None
    count = len(source.splitlines())
    lines = [f"{path} ({count} lines)"]
    _outline_body(module.body, 0, lines)
    if len(lines) == 1:
        lines.append("(no classes or functions)")
    if len(lines) > MAX_OUTLINE_LINES:
        lines = lines[:MAX_OUTLINE_LINES] + ["[... cut; grep for a name to find the rest]"]
    return "\n".join(lines)


def _outline_body(body: list[ast.stmt], level: int, lines: list[str]) -> None:
    for node in body:
        indent = "    " * level
        if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])  # decorators belong to it
        span = f"[{start}-{node.end_lineno}]"
        decorators = "".join(f"@{ast.unparse(d)} " for d in node.decorator_list)
        if isinstance(node, ast.ClassDef):
            bases = ", ".join(ast.unparse(b) for b in node.bases + node.keywords)
            lines.append(f"{indent}{decorators}class {node.name}{f'({bases})' if bases else ''}  {span}")
            _outline_body(node.body, level + 1, lines)
        else:
            prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
            returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
            lines.append(f"{indent}{decorators}{prefix} {node.name}({ast.unparse(node.args)}){returns}  {span}")
