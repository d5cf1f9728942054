"""The workspace jail: every path the agent names stays inside its channel's workspace.

A channel's workspace is one directory on the host. The agent names files in
it by relative paths (``notes/a.txt``); the file tools turn those names into
host paths with ``Workspace.resolve``, which refuses, with ``PathEscape``:

- ``..`` anywhere in the path (even ``a/../b``, which stays inside: a path
  with ``..`` means something different once a component is a symlink, so the
  jail does not try to be clever about it);
- absolute paths outside the workspace (absolute paths inside it, and paths
  under ``/workspace``, where sandboxed programs see the workspace, are fine);
- symlinks anywhere in the chain (a middle directory, the last component, a
  link to a link, a dangling link) whose target lies outside the workspace.
  Symlinks that stay inside are followed.

What this does not cover (the TOCTOU caveat): ``resolve`` checks the path at
one moment and the caller opens it a moment later. A program running in the
same workspace at that moment (a background Python job) could swap a checked
directory for a symlink in between, and a plain ``open()`` of the resolved
path would follow it out. ``Workspace.open`` closes that gap: it walks the
resolved path from the workspace root one component at a time with
``O_NOFOLLOW``, so a swapped-in link fails the open instead of being
followed. Tools that write while jobs may run should open files with it. The
process runner does not rely on this module at all: sandboxed programs see
only the bind-mounted workspace, so a symlink they make points into the
sandbox's own view of the file system, never the host's.

Hard links are not refused: the sandbox cannot make a hard link to a host
file (host files are not visible to it, and links across mounts fail), so a
hard link in a workspace can only come from the host itself.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
from pathlib import Path, PurePosixPath

__all__ = ["MOUNT_POINT", "PathEscape", "Workspace", "workspace_for"]

# Where sandboxed programs see the workspace (sandbox.process binds it there).
# Agents copy paths from program output, so the jail accepts them too.
MOUNT_POINT = PurePosixPath("/workspace")

_ALLOWED = "paths must stay inside the workspace; use relative paths like notes/a.txt"


class PathEscape(ValueError):
    """A path that would lead out of the workspace, or is malformed."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"refused {path!r}: {reason}; {_ALLOWED}")


class Workspace:
    """One channel's directory on the host, with ``scratch/`` for throwaway files."""

    def __init__(self, root: Path) -> None:
        root = Path(root)
        # 0700: files the agent writes are nobody else's business on the host.
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Resolved once: the host chose this path, so links above it are trusted.
        self.root = root.resolve()
        self.scratch = self.root / "scratch"
        self._ensure_scratch()

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    def resolve(self, path: str, *, must_exist: bool = False) -> Path:
        """The host path for ``path``, with symlinks resolved; ``PathEscape`` if it leads out.

        ``must_exist=True`` raises ``FileNotFoundError`` (with the
        workspace-relative name) when nothing is there.
        """
        parts = self._parts(path)
        candidate = self.root.joinpath(*parts)
        real = Path(os.path.realpath(candidate))
        if not self._inside(real):
            raise PathEscape(path, self._which_link(parts))
        if must_exist and not os.path.lexists(real):
            raise FileNotFoundError(errno.ENOENT, "no such file or folder in the workspace",
                                    "/".join(parts) or ".")
        return real

    def relative(self, path: Path | str) -> str:
        """``path`` (a host path inside the workspace) as the agent knows it, e.g. ``notes/a.txt``."""
        absolute = Path(os.path.abspath(path))
        if not self._inside(absolute):
            raise PathEscape(str(path), "it is not inside the workspace")
        return absolute.relative_to(self.root).as_posix()

    def open(self, path: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
        """A file descriptor for ``path``, opened without following any symlink.

        The race-free way to open: ``resolve`` applies the policy and gives
        the real path, then each component is opened relative to its parent
        with ``O_NOFOLLOW``, so a link swapped in after the check fails with
        ``PathEscape`` instead of being followed. FIFOs and devices are
        refused (``OSError``), since opening one could block the bot.
        """
        real = self.resolve(path)
        parts = real.relative_to(self.root).parts
        fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts[:-1]:
                parent, fd = fd, -1
                try:
                    fd = self._step(parent, part, os.O_PATH | os.O_DIRECTORY, path)
                finally:
                    os.close(parent)
            last, extra = (parts[-1], os.O_NONBLOCK) if parts else (".", os.O_DIRECTORY)
            opened = self._step(fd, last, flags | extra, path, mode)
        finally:
            if fd >= 0:
                os.close(fd)
        try:
            kind = os.fstat(opened).st_mode
            if not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):
                raise OSError(errno.EINVAL, "not a regular file or folder", path)
            os.set_blocking(opened, not flags & os.O_NONBLOCK)
            return opened
        except BaseException:
            os.close(opened)
            raise

    def clear_scratch(self) -> None:
        """Empty ``scratch/`` without following any link the agent left in it."""
        if self.scratch.is_symlink() or not self.scratch.is_dir():
            self._ensure_scratch()
            return
        for entry in os.scandir(self.scratch):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, onerror=_make_writable_and_retry)
            else:
                os.unlink(entry.path)

    # --- helpers ---

    def _parts(self, path: str) -> tuple[str, ...]:
        """The components of ``path`` relative to the root, after the lexical checks."""
        if not isinstance(path, str) or not path.strip():
            raise PathEscape(str(path), "the path is empty")
        if "\0" in path:
            raise PathEscape(path, "the path contains a NUL byte")
        pure = PurePosixPath(path)
        if ".." in pure.parts:
            raise PathEscape(path, "'..' is not allowed")
        if pure.is_absolute():
            for base in (PurePosixPath(self.root), MOUNT_POINT):
                if pure == base or base in pure.parents:
                    return pure.relative_to(base).parts
            raise PathEscape(path, "it is an absolute path outside the workspace")
        return pure.parts

    def _inside(self, path: Path) -> bool:
        return path == self.root or self.root in path.parents

    def _which_link(self, parts: tuple[str, ...]) -> str:
        """Why a path with no ``..`` still led out: name the first link that does."""
        for i in range(1, len(parts) + 1):
            prefix = self.root.joinpath(*parts[:i])
            if prefix.is_symlink():
                target = Path(os.path.realpath(prefix))
                if not self._inside(target):
                    shown = "/".join(parts[:i])
                    return f"{shown} is a symlink to {os.readlink(prefix)}, outside the workspace"
        return "it leads outside the workspace"

    def _step(self, dir_fd: int, name: str, flags: int, path: str, mode: int = 0o644) -> int:
        """Open ``name`` under ``dir_fd`` without following a link."""
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(name, dir_fd):
                raise PathEscape(path, f"{name} changed into a link while it was being opened") from exc
            raise

    def _ensure_scratch(self) -> None:
        # The agent may have replaced scratch/ by a link or a file; never follow it.
        if self.scratch.is_symlink() or (self.scratch.exists() and not self.scratch.is_dir()):
            self.scratch.unlink()
        self.scratch.mkdir(exist_ok=True)


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _make_writable_and_retry(func, path, _exc_info) -> None:
    # A program running as the bot's own user may have left a read-only folder.
    parent = os.path.dirname(path)
    os.chmod(parent, stat.S_IRWXU)
    func(path)


def workspace_for(data_dir: Path, channel: str) -> Workspace:
    """The workspace of ``channel`` under ``data_dir``: a readable slug plus a hash.

    The slug keeps the directory recognisable; the hash of the exact channel
    id keeps distinct channels apart even when their slugs are equal
    (``a/b`` and ``a-b``) or the slug is cut short.
    """
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", channel).strip("-")[:40] or "channel"
    digest = hashlib.sha256(channel.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return Workspace(Path(data_dir) / f"{slug}-{digest}")
