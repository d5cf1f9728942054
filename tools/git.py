"""git tools for the agent's workspace: status, diff, log, add, commit, restore a file, branches.

Git runs only in the channel's sandbox (tools.programs), never on the host,
and only on the workspace: ``GIT_DIR`` and ``GIT_WORK_TREE`` name the
workspace's ``.git`` and the workspace itself, so no repository above it is
ever found. The first git tool in a workspace without ``.git`` runs
``git init`` (branch ``main``) and says so.

What the tools refuse or leave out:

- No tool reaches another repository or the network: there is no push, pull,
  fetch, remote, clone or submodule, and ``protocol.allow=never`` stands in
  case a command would still try; the sandbox has no network anyway.
- No tool changes config. The identity, ``core.hooksPath=/dev/null`` (no
  hooks), ``core.fsmonitor=false``, no signing and no pager are set per call
  with ``-c``; the system and global config files are not read
  (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL=/dev/null``), so a
  ``.gitconfig`` the agent writes into its workspace (``$HOME``) is ignored.
- ``git_add`` refuses a file over ``MAX_ADD_BYTES`` (100 MiB, the largest file a sandboxed
  program may write) that git does not ignore: hashing a 10 GB file ran until the 60 s
  timeout (bench/reliability.py, hostile inputs).
- Paths and revisions starting with ``-`` are refused (option injection), a
  revision may hold only ``A-Z a-z 0-9 _ . / ~ ^ -``, and paths go through the
  workspace jail and after ``--``, as literal pathspecs.

Not covered: the repository's own ``.git/config`` and ``.gitattributes`` are
the agent's to write (with run_python), and can name filter or diff programs.
Those run inside the same sandbox as run_python, so they gain nothing.

Journal: ``git_checkout_file`` and switching branches change working files,
so they are bracketed like run_python (tools.programs.ProgramChanges) and
``undo`` reverts the working files. Undo does not touch ``.git``: the index
and the branch stay as git left them. add and commit change only ``.git``.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
from pathlib import Path

from sandbox.process import ProcessResult
from tools import ToolContext, ToolError, tool
from tools.files import rel, resolve_no_follow
from tools.programs import ProgramChanges, clip, run_program, workspace_in_sandbox

GIT_TIMEOUT_S = 60
MAX_DIFF_CHARS = 12_000
MAX_LOG = 100
MAX_ADD_BYTES = 100 * 2**20  # as sandbox.process.Limits.file_size_mb: larger is not the agent's
_CONFIG = {
    "core.hooksPath": "/dev/null", "core.fsmonitor": "false", "user.name": "Nightshift",
    "user.email": "agent@nightshift.local", "commit.gpgSign": "false", "tag.gpgSign": "false",
    "core.pager": "cat", "color.ui": "false", "safe.directory": "*", "protocol.allow": "never",
    "init.defaultBranch": "main", "core.quotePath": "false", "advice.detachedHead": "false",
}
_REV = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./~^-]{0,99}")
_BRANCH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,99}")


async def _git(ctx: ToolContext, *args: str, check: bool = True) -> ProcessResult:
    """Run ``git <args>`` in the sandbox on the workspace's repository."""
    where = workspace_in_sandbox(ctx)
    argv = ["git", "-C", where]
    for key, value in _CONFIG.items():
        argv += ["-c", f"{key}={value}"]
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": where,
           "GIT_DIR": f"{where}/.git", "GIT_WORK_TREE": where, "GIT_LITERAL_PATHSPECS": "1",
           "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat"}
    result = await run_program(ctx, [*argv, *args], timeout_s=GIT_TIMEOUT_S, env=env)
    if check and not result.ok:
        raise ToolError(_failure(args[0], result))
    return result


def _failure(command: str, result: ProcessResult) -> str:
    if result.timed_out:
        return f"git {command} did not finish within {GIT_TIMEOUT_S} s and was stopped"
    said = (result.stderr.strip() or result.stdout.strip() or "no message")
    return f"git {command} failed (exit {result.returncode}): {clip(said, 2000)}"


async def _repo(ctx: ToolContext) -> str:
    """Make sure the workspace is a repository; returns a line saying so when it had to init."""
    dot_git = ctx.workspace.root / ".git"
    if dot_git.is_symlink() or (dot_git.exists() and not dot_git.is_dir()):
        raise ToolError(".git in your workspace is not a folder (a file or a link); the git tools "
                        "work only with a plain .git folder. Delete or rename it first")
    if dot_git.is_dir():
        return ""
    # Without GIT_DIR/GIT_WORK_TREE (set by _git): git init would record core.worktree.
    where = workspace_in_sandbox(ctx)
    result = await run_program(
        ctx, ["git", "-c", "init.defaultBranch=main", "-c", "core.hooksPath=/dev/null",
              "init", "-q", where],
        timeout_s=GIT_TIMEOUT_S, env={"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"})
    if not result.ok:
        raise ToolError(_failure("init", result))
    return "(your workspace was not a git repository: initialized an empty one, branch main)\n"


def _path(ctx: ToolContext, path: str) -> str:
    """A workspace path as git should see it, relative to the workspace; refuses options."""
    if path.startswith("-"):
        raise ToolError(f"refused path {path!r}: it starts with '-', which git would read as an "
                        f"option. Name files relative to your workspace, e.g. notes/a.txt")
    target = resolve_no_follow(ctx, path)
    return "." if target == ctx.workspace.root else rel(ctx, target)


def _rev(rev: str) -> str:
    if rev.startswith("-"):
        raise ToolError(f"refused revision {rev!r}: it starts with '-', which git would read as an "
                        f"option. Use a branch, a tag, a commit hash or HEAD~1")
    if not _REV.fullmatch(rev) or ".." in rev or rev.endswith((".", "/", ".lock")):
        raise ToolError(f"refused revision {rev!r}: use a branch, a tag, a commit hash or forms "
                        f"like HEAD~2 and main^ (letters, digits and _ . / ~ ^ - only)")
    return rev


def _branch_name(name: str) -> str:
    if name.startswith("-"):
        raise ToolError(f"refused branch name {name!r}: it starts with '-', which git would read "
                        f"as an option")
    if (not _BRANCH.fullmatch(name) or ".." in name or "//" in name
            or name.endswith((".", "/", ".lock"))):
        raise ToolError(f"refused branch name {name!r}: use letters, digits and _ . / - "
                        f"(e.g. fix/parser-bug)")
    return name


async def _journaled(ctx: ToolContext, label: str, *args: str) -> tuple[ProcessResult, str]:
    """Run a git command that changes working files, recording the changes in the journal."""
    changes = ProgramChanges(ctx, label)
    await asyncio.to_thread(changes.before)
    try:
        result = await _git(ctx, *args)
    finally:
        note = await asyncio.to_thread(changes.after)
    return result, note


# --- tools ---


@tool
async def git_status(ctx: ToolContext) -> str:
    """Show the git status of your workspace: the branch, and changed, staged and untracked
    files (short format: first column staged, second unstaged, ?? untracked)."""
    note = await _repo(ctx)
    out = (await _git(ctx, "status", "--short", "--branch")).stdout.rstrip("\n")
    if len(out.splitlines()) <= 1:
        out += "\n(nothing changed since the last commit)"
    return note + clip(out, MAX_DIFF_CHARS)


@tool
async def git_diff(ctx: ToolContext, path: str = "", staged: bool = False) -> str:
    """Show changes as a unified diff: working files against the staged state, or (staged=true)
    the staged state against the last commit.

    Args:
        path: Only this file or folder, relative to your workspace; "" for everything.
        staged: Show what git_commit would commit instead of the unstaged changes.
    """
    args = ["diff", "--no-ext-diff", "--no-textconv", "--no-color"]
    if staged:
        args.append("--staged")
    if path:
        args += ["--", _path(ctx, path)]
    note = await _repo(ctx)
    out = (await _git(ctx, *args)).stdout
    if not out.strip():
        other = "staged=false for unstaged ones" if staged else "staged=true for staged ones"
        return f"{note}no {'staged ' if staged else 'unstaged '}differences (try {other})"
    if len(out) > MAX_DIFF_CHARS:
        out = clip(out, MAX_DIFF_CHARS) + "\n(the diff was cut; pass path to see one file)"
    return note + out


@tool
async def git_log(ctx: ToolContext, limit: int = 10) -> str:
    """Show the latest commits of the current branch, newest first: hash, date, subject.

    Args:
        limit: How many commits to show, 1 to 100.
    """
    if not 1 <= limit <= MAX_LOG:
        raise ToolError(f"limit must be between 1 and {MAX_LOG}, got {limit}")
    note = await _repo(ctx)
    result = await _git(ctx, "log", f"--max-count={limit}", "--format=%h %ad %s",
                        "--date=format:%Y-%m-%d %H:%M", check=False)
    if not result.ok:
        if "does not have any commits" in result.stderr:
            return f"{note}no commits yet; git_add then git_commit make the first"
        raise ToolError(_failure("log", result))
    return note + result.stdout.rstrip("\n")


@tool
async def git_add(ctx: ToolContext, paths: list[str]) -> str:
    """Stage files for the next commit (a folder stages everything in it; "." stages all).

    Args:
        paths: Files or folders relative to your workspace, e.g. ["main.py", "notes"].
    """
    if not paths:
        raise ToolError('paths is empty; name what to stage, e.g. ["main.py"] or ["."]')
    names = [_path(ctx, p) for p in paths]
    note = await _repo(ctx)
    big = await asyncio.to_thread(_too_big, ctx.workspace.root, names)
    if big:  # unless git ignores them (a folder or "." would then skip them anyway)
        ignored = await _git(ctx, "ls-files", "--others", "--ignored", "--exclude-standard",
                             "--", *big, check=False)
        big = [b for b in big if b not in ignored.stdout.splitlines()]
    if big:
        raise ToolError(f"refused: {', '.join(big[:5])} {'is' if len(big) == 1 else 'are'} over "
                        f"{MAX_ADD_BYTES >> 20} MiB; git_add stages files up to that size. Leave "
                        "them out (list them in .gitignore) and stage the rest")
    await _git(ctx, "add", "--", *names)
    status = (await _git(ctx, "status", "--short")).stdout.rstrip("\n")
    return f"{note}staged {', '.join(names)}\n{clip(status, MAX_DIFF_CHARS) or '(nothing changed)'}"


def _too_big(root: Path, names: list[str]) -> list[str]:
    """The regular files under ``names`` (files or folders, .git skipped) over MAX_ADD_BYTES,
    relative to the workspace; links are not followed, and folders are walked by
    descriptor (``os.fwalk``), so one swapped for a link mid-walk is not followed."""
    big = []
    for name in names:
        top = root / name
        try:
            info = top.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode):
            if stat.S_ISREG(info.st_mode) and info.st_size > MAX_ADD_BYTES:
                big.append(os.path.relpath(top, root))
            continue
        for folder, dirs, found, dir_fd in os.fwalk(top, follow_symlinks=False):
            dirs[:] = [d for d in dirs if d != ".git"]
            for file in found:
                try:
                    info = os.stat(file, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode) and info.st_size > MAX_ADD_BYTES:
                    big.append(os.path.relpath(os.path.join(folder, file), root))
    return big


@tool
async def git_commit(ctx: ToolContext, message: str) -> str:
    """Commit what is staged (git_add stages), as Nightshift <agent@nightshift.local>.

    Args:
        message: The commit message: a short first line, then optionally a blank line and details.
    """
    if not message.strip():
        raise ToolError("message is empty; say what the commit changes")
    note = await _repo(ctx)
    result = await _git(ctx, "commit", "--no-verify", "--no-gpg-sign", f"--message={message}",
                        check=False)
    if not result.ok:
        said = result.stdout + result.stderr
        if "nothing to commit" in said or "no changes added" in said:
            raise ToolError("nothing to commit: nothing is staged. git_add stages files; "
                            "git_status shows what changed")
        raise ToolError(_failure("commit", result))
    return note + result.stdout.rstrip("\n")


@tool
async def git_checkout_file(ctx: ToolContext, path: str, rev: str = "HEAD") -> str:
    """Restore a file (or folder) to its content at a commit, in your workspace and in the
    staged state. It is journaled: undo brings back the working file as it was before.

    Args:
        path: The file or folder, relative to your workspace.
        rev: The commit to take it from: HEAD (the last commit), a branch, a hash or HEAD~2.
    """
    name, revision = _path(ctx, path), _rev(rev)
    note = await _repo(ctx)
    _, journaled = await _journaled(ctx, f"git_checkout_file {name} {revision}",
                                    "checkout", revision, "--", name)
    done = f"restored {name} from {revision}"
    return f"{note}{done}\n{journaled}" if journaled else f"{note}{done} (it was already the same)"


@tool
async def git_branch(ctx: ToolContext, name: str = "", create: bool = False) -> str:
    """List branches (no name), switch to a branch, or create one and switch to it (create=true).
    Switching changes working files; that is journaled, so undo restores them.

    Args:
        name: The branch to switch to or create; "" lists the branches.
        create: Create the branch from the current commit, then switch to it.
    """
    if create and not name:
        raise ToolError("create=true needs a name for the new branch")
    branch = _branch_name(name) if name else ""
    note = await _repo(ctx)
    if not branch:
        result = await _git(ctx, "branch", "--list", "--no-color")
        current = (await _git(ctx, "symbolic-ref", "--short", "HEAD", check=False)).stdout.strip()
        listing = result.stdout.rstrip("\n") or f"* {current} (no commits yet)"
        return f"{note}{listing}"
    args = ["switch", "--create", branch] if create else ["switch", branch]
    result, journaled = await _journaled(ctx, f"git_branch {'create ' if create else ''}{branch}",
                                         *args)
    said = (result.stderr.strip() or result.stdout.strip())
    return "\n".join(part for part in (note + said, journaled) if part)
