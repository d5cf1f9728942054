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
import stat
from pathlib import Path, PurePosixPath

__all__ = ["MOUNT_POINT", "PathEscape", "Workspace", "workspace_for", "workspace_path"]

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
        """Empty ``scratch/`` by folder descriptor, never by path.

        A background job can swap ``scratch/`` (or any folder in it) for a link between
        a check and a removal (``renameat2(RENAME_EXCHANGE)``, timed with inotify): a
        removal by path then deleted the host folders the link led to. Here every folder
        is opened ``O_NOFOLLOW`` relative to its parent's descriptor, and every removal
        and permission change goes through a descriptor (``remove_tree``), so a swapped
        link is removed as a link, or refused, and nothing outside is touched."""
        root = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            try:
                scratch = os.open("scratch", DIR_OPEN, dir_fd=root)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                    raise
                self._ensure_scratch()  # a link or a file stands there: replaced, not followed
                return
            try:
                empty_folder(scratch)
            finally:
                os.close(scratch)
        finally:
            os.close(root)

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


DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 256  # deeper trees than this are refused whole: one descriptor per level


def empty_folder(dir_fd: int, depth: int = 0) -> None:
    """Remove everything in the folder open as ``dir_fd``, through descriptors only: an
    entry that turns into a link mid-way is unlinked as a link, never followed. A folder
    a job left read-only is made writable through its own descriptor first."""
    if depth > MAX_DEPTH:
        raise OSError(errno.ELOOP, f"folders nested more than {MAX_DEPTH} deep")
    _own(dir_fd)
    for name in os.listdir(dir_fd):
        remove_entry(dir_fd, name, depth)


def remove_entry(dir_fd: int, name: str, depth: int = 0) -> None:
    """Remove ``name`` under ``dir_fd``, a whole folder tree included, never following a
    link; an entry gone meanwhile is done."""
    for _ in range(3):  # a job may swap the entry between the two calls below
        try:
            os.unlink(name, dir_fd=dir_fd)
            return
        except FileNotFoundError:
            return
        except IsADirectoryError:
            pass
        except PermissionError as exc:  # EPERM: unlink of a folder on Linux
            if exc.errno != errno.EPERM:
                raise
        try:
            child = os.open(name, DIR_OPEN, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                continue  # it became a link or a file: unlink it as one
            raise
        try:
            empty_folder(child, depth + 1)
        finally:
            os.close(child)
        try:
            os.rmdir(name, dir_fd=dir_fd)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ENOTEMPTY):
                raise  # refilled or swapped meanwhile: go round again
    raise OSError(errno.EBUSY, f"{name} kept changing while it was being removed")


def _own(dir_fd: int) -> None:
    """Make the folder writable by its owner through its descriptor (``/proc/self/fd``
    names the open folder itself, not a path a job could swap)."""
    mode = os.fstat(dir_fd).st_mode
    if mode & stat.S_IRWXU != stat.S_IRWXU:
        os.chmod(f"/proc/self/fd/{dir_fd}", stat.S_IMODE(mode) | stat.S_IRWXU)


def workspace_for(data_dir: Path, channel: str) -> Workspace:
    """The workspace of ``channel`` under ``data_dir``, made if missing (``workspace_path``)."""
    return Workspace(workspace_path(data_dir, channel))


def workspace_path(data_dir: Path, channel: str) -> Path:
    """Where ``channel``'s workspace lies under ``data_dir``: a readable slug plus a hash.

    The slug keeps the directory recognisable; the hash of the exact channel
    id keeps distinct channels apart even when their slugs are equal
    (``a/b`` and ``a-b``) or the slug is cut short.
    """
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", channel).strip("-")[:40] or "channel"
    digest = hashlib.sha256(channel.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return Path(data_dir) / f"{slug}-{digest}"
