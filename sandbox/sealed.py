"""A sealed run: a program in bubblewrap with no workspace, only read-only binds.

For work on untrusted bytes that needs no files of its own (``tools.worker``'s
parsers): the program reads its input from stdin and from descriptors the
caller opened and passes down, and answers on stdout. It runs in the same two
shapes as every sandboxed program (``sandbox.bwrap``), so it ends as a
non-root host uid (``nightshift-sandbox`` when the bot is root) with no
capabilities, in private PID, network, IPC, UTS and cgroup namespaces, and
cannot make user namespaces.

What it sees: read-only ``/usr`` with the top-level links into it (the
loader and libc), the bot's Python installation read-only when it lives
outside ``/usr``, the loader's cache, a private ``/proc`` (its own processes
only), a minimal ``/dev``, an empty ``/tmp`` and the caller's read-only
binds. The whole tree is read-only: no workspace, no data dir, no ``/root``,
no ``/etc/passwd``. The caller starts it with an empty environment.

Not covered: the kernel (no seccomp filter), what ``/usr`` and the
interpreter's installation hold (public files), and the descriptors the
caller passes: the program can do with them what their open mode allows.
"""

from __future__ import annotations

import os
import shutil
from pathlib import PurePosixPath

from sandbox.bwrap import (
    HOST_PATH,
    SandboxUnavailable,
    prefix_mounts,
    setup_user,
    system_mounts,
    wrap,
)

__all__ = ["sealed_command"]


def sealed_command(bwrap: str, binds: dict[str, str], program: list[str]) -> list[str]:
    """The command line that runs ``program`` sealed; start it with an empty environment.

    ``binds`` maps an absolute path inside to the host file or folder bound
    there read-only. As root this finds (or creates) the sandbox user, and
    raises ``SandboxUnavailable`` when it cannot drop to it.
    """
    drop_to, setpriv = None, None
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv", path=HOST_PATH)
        if setpriv is None:
            raise SandboxUnavailable("setpriv (util-linux) is missing: as root, the sandbox "
                                     "needs it to drop to an unprivileged user")
        drop_to = setup_user()
    return wrap(bwrap, _mounts(binds), ["--chdir", "/"], drop_to, setpriv, as_pid_1=True) + program


def _mounts(binds: dict[str, str]) -> list[str]:
    # An empty, read-only /tmp: the inner bwrap of the root shape mounts its scratch there.
    args = [*system_mounts(), "--perms", "0755", "--dir", "/tmp", *prefix_mounts(),
            "--perms", "0755", "--dir", "/etc", "--ro-bind-try", "/etc/ld.so.cache",
            "/etc/ld.so.cache"]
    made: set[PurePosixPath] = set()
    for inside, host in binds.items():
        target = PurePosixPath(inside)
        if not target.is_absolute():
            raise ValueError(f"a sealed bind must name an absolute path inside, not {inside!r}")
        # bwrap would make missing parents 0700, which the sandbox user cannot enter.
        for parent in reversed(target.parents[:-1]):
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", host, inside]
    # bwrap's root is a tmpfs: read-only, so the program can write nowhere.
    return args + ["--remount-ro", "/"]
