"""A directory tree used without ever following a link: how the tools touch files.

``Workspace.resolve`` checks a path at one moment; a background job in the
same workspace could swap a checked folder for a link to the host before the
tool uses the path. ``FsRoot`` closes that gap: it opens each component of a
path relative to its parent with ``O_NOFOLLOW``, so a link anywhere in the
path makes the operation fail with ``PathEscape`` instead of being followed.
Paths are workspace-style relative strings (``"a/b.txt"``); every write is a
temp file in the same folder plus ``os.replace``, both relative to the
folder's descriptor.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sandbox.paths import PathEscape

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO someone left in the workspace must not hang the bot.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to a trusted host path (not the workspace) via a temp file and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    # os.open honours the umask (mkstemp would make every file 0600).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class FsRoot:
    """File operations below ``root`` that refuse links in the path instead of following them."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @contextmanager
    def parent(self, rel: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """A descriptor of ``rel``'s folder and its last component; ``create`` makes missing folders."""
        parts = rel.split("/")
        fd = os.open(self.root, DIR_FLAGS)
        try:
            for i, part in enumerate(parts[:-1]):
                parent_fd, fd = fd, -1  # _step closes the parent, even when it raises
                fd = self._step(parent_fd, part, create, "/".join(parts[:i + 1]))
            yield fd, parts[-1]
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PathEscape(rel, "a link appeared in it while it was in use") from exc
            raise
        finally:
            if fd >= 0:
                os.close(fd)

    def _step(self, fd: int, name: str, create: bool, shown: str) -> int:
        """Open folder ``name`` under ``fd`` (closing ``fd``), never through a link."""
        try:
            try:
                return os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, dir_fd=fd)
                return os.open(name, DIR_FLAGS, dir_fd=fd)
        except NotADirectoryError:
            # O_DIRECTORY | O_NOFOLLOW on a link fails with ENOTDIR, as on a file: tell them apart.
            if stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                raise PathEscape(shown, "it became a link while it was in use") from None
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", shown) from None
        finally:
            os.close(fd)

    def lstat(self, rel: str) -> os.stat_result | None:
        """The path's own status (a link is not followed); None when nothing is there."""
        try:
            with self.parent(rel) as (fd, name):
                return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read(self, rel: str) -> bytes:
        with self.parent(rel) as (fd, name):
            file_fd = os.open(name, READ_FLAGS, dir_fd=fd)
        with os.fdopen(file_fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(file_fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", rel)
            os.set_blocking(file_fd, True)
            return f.read()

    def readlink(self, rel: str) -> str:
        with self.parent(rel) as (fd, name):
            return os.readlink(name, dir_fd=fd)

    def listdir(self, rel: str) -> list[str]:
        with self.parent(rel) as (fd, name):
            dir_fd = os.open(name, DIR_FLAGS, dir_fd=fd)
        try:
            return sorted(os.listdir(dir_fd))
        finally:
            os.close(dir_fd)

    def write(self, rel: str, data: bytes, *, parents: bool = False) -> None:
        with self.parent(rel, create=parents) as (fd, name):
            tmp = f".{name}.{secrets.token_hex(4)}.tmp"
            file_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                              0o666, dir_fd=fd)
            try:
                with os.fdopen(file_fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=fd)
                except FileNotFoundError:
                    pass
                raise

    def mkdir(self, rel: str, *, parents: bool = False) -> None:
        with self.parent(rel, create=parents) as (fd, name):
            os.mkdir(name, dir_fd=fd)

    def symlink(self, target: str, rel: str) -> None:
        with self.parent(rel) as (fd, name):
            os.symlink(target, name, dir_fd=fd)

    def unlink(self, rel: str) -> None:
        with self.parent(rel) as (fd, name):
            os.unlink(name, dir_fd=fd)

    def rmdir(self, rel: str) -> None:
        with self.parent(rel) as (fd, name):
            os.rmdir(name, dir_fd=fd)

    def remove(self, rel: str) -> None:
        """Delete a file, a link (not its target) or a folder with everything in it."""
        with self.parent(rel) as (fd, name):
            if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                shutil.rmtree(name, dir_fd=fd)  # fd-based: never follows a link inside
            else:
                os.unlink(name, dir_fd=fd)
