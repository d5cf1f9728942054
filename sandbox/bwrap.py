"""The bubblewrap command line, and the unprivileged user the sandbox runs as.

Two shapes, because rlimits and the uid only mean something for a non-root
uid on the host (RLIMIT_NPROC is not enforced for root, and root may read
every file):

- The bot runs as an ordinary user: one unprivileged ``bwrap`` in a new user
  namespace, as that user.
- The bot runs as root: the dedicated system user ``nightshift-sandbox``
  (``setup_user``). An outer ``bwrap``, as root, builds the mount namespace
  (only root can bind the interpreter prefix when it lives under a 0700
  ``/root``), keeps just the capabilities to change uid, and runs
  ``setpriv`` to become that user with no capabilities and no supplementary
  groups. An inner, unprivileged ``bwrap`` then adds the user namespace and
  ``--disable-userns``. Tried and rejected with bwrap 0.8: ``--uid`` as root
  maps the sandbox's uid onto host uid 0; dropping the uid *before* one
  unprivileged bwrap cannot bind a prefix under ``/root``.

Either way the sandboxed program ends as a non-zero host uid, with every
namespace unshared (``--unshare-all`` in total) and no way to make more user
namespaces. ``wrap`` builds either shape around a list of mounts: the
workspace sandbox's (``bwrap_argv``), or a sealed run's (``sandbox.sealed``).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from sandbox.paths import MOUNT_POINT

__all__ = ["MIN_VERSION", "SANDBOX_USER", "SandboxUnavailable", "bwrap_argv", "find_bwrap",
           "hand_over", "interpreter_prefix", "prefix_mounts", "setup_user", "system_mounts",
           "wrap"]

SANDBOX_USER = "nightshift-sandbox"
# --disable-userns and sized tmpfs mounts (--size) need 0.8.
MIN_VERSION = (0, 8, 0)
# Outside the sandbox: what bwrap, setpriv and useradd themselves need.
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The top-level links (merged /usr) or directories a Debian-like system needs to run anything.
_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Harmless parts of /etc: the loader's cache and Debian's alternatives (links into /usr).
_ETC_SHARED = ("/etc/ld.so.cache", "/etc/alternatives")

_INSTALL_HINT = ("install bubblewrap 0.8 or newer (Debian/Ubuntu: apt-get install bubblewrap), "
                 "or set sandbox.allow_unsandboxed = true in config.toml to run code without "
                 "a sandbox (unsafe: it then runs as the bot's user)")


class SandboxUnavailable(RuntimeError):
    """Code cannot run sandboxed here, and running it unsandboxed is not allowed."""


def find_bwrap() -> str | None:
    """The bwrap binary when it is new enough, else None."""
    path = shutil.which("bwrap", path=HOST_PATH)
    if path is None:
        return None
    return path if bwrap_version(path) >= MIN_VERSION else None


def bwrap_version(path: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(n) for n in match.groups()) if match else ()


def missing_message() -> str:
    """Why code will not run, and the two ways to fix it."""
    found = shutil.which("bwrap", path=HOST_PATH)
    if found is None:
        what = "bubblewrap (bwrap) is not installed"
    else:
        version = ".".join(map(str, bwrap_version(found))) or "unknown"
        what = f"{found} is bubblewrap {version}, too old"
    return f"cannot run code in a sandbox: {what}. Fix: {_INSTALL_HINT}."


def setup_user(name: str = SANDBOX_USER) -> tuple[int, int]:
    """(uid, gid) of the sandbox's system user; created on first use. Needs root.

    Idempotent and safe when two processes race: whoever loses finds the
    user the other one made.
    """
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd", path=HOST_PATH)
        if useradd is None:
            raise SandboxUnavailable(
                f"cannot create the sandbox user {name}: useradd is missing. Fix: create a "
                f"system user {name} with no home and no shell, or run the bot as a non-root user."
            ) from None
        done = subprocess.run(
            [useradd, "--system", "--no-create-home", "--user-group",
             "--shell", "/usr/sbin/nologin", name],
            capture_output=True, text=True, env={"PATH": HOST_PATH}, check=False,
        )
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise SandboxUnavailable(
                f"cannot create the sandbox user {name}: {done.stderr.strip() or done.returncode}"
            ) from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise SandboxUnavailable(f"the sandbox user {name} has uid or gid 0; it must be unprivileged")
    return entry.pw_uid, entry.pw_gid


def interpreter_prefix() -> Path | None:
    """The bot's base Python installation when ``/usr`` does not already hold it."""
    prefix = Path(sys.base_prefix).resolve()
    usr = Path("/usr")
    if prefix == usr or usr in prefix.parents or not (prefix / "bin").is_dir():
        return None
    return prefix


def hand_over(root: Path, uid: int, gid: int) -> None:
    """Make the workspace the sandbox user's, so programs can change what the bot wrote.

    The bot (root) writes files as root; the sandbox user could read them but
    not change them. ``os.fwalk`` with ``follow_symlinks=False`` changes the
    links themselves, never their targets, and opens each directory relative
    to its parent, so a directory swapped for a link mid-walk is not entered.
    Files with more than one hard link are left alone: a hard link into the
    host must never hand a host file to the sandbox.
    """
    os.chown(root, uid, gid)
    os.chmod(root, 0o700)
    for _dir, dirs, files, dir_fd in os.fwalk(root, follow_symlinks=False):
        for name in dirs + files:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if (st.st_uid, st.st_gid) == (uid, gid):
                    continue
                if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
                    continue
                os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we walked


def etc_files(uid: int, gid: int) -> dict[str, str]:
    """A synthetic /etc/passwd and /etc/group: tools like git look the user up."""
    home = str(MOUNT_POINT)
    return {
        "/etc/passwd": (f"sandbox:x:{uid}:{gid}:Nightshift sandbox:{home}:/usr/sbin/nologin\n"
                        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"),
        "/etc/group": f"sandbox:x:{gid}:\nnogroup:x:65534:\n",
    }


def bwrap_argv(bwrap: str, *, workspace: Path, data_fds: dict[str, int], tmp_bytes: int,
               drop_to: tuple[int, int] | None, setpriv: str | None) -> list[str]:
    """The command line that runs a program inside the sandbox; append the program's argv.

    ``drop_to`` is (uid, gid) when the bot is root (the two-stage shape);
    ``data_fds`` maps /etc files to readable pipe ends holding their contents.

    The environment is not on this command line: the caller starts bwrap
    with exactly the sandbox's environment (not the bot's), which bwrap and
    setpriv pass on. That is what ``--clearenv`` + ``--setenv`` would do, but
    without putting the values in argv, which every host user can read in
    /proc/PID/cmdline.
    """
    return wrap(bwrap, _mounts(workspace, data_fds, tmp_bytes), ["--chdir", str(MOUNT_POINT)],
                drop_to, setpriv)


def wrap(bwrap: str, mounts: list[str], chdir: list[str], drop_to: tuple[int, int] | None,
         setpriv: str | None, *, as_pid_1: bool = False) -> list[str]:
    """bwrap's command line in one of the two shapes (see above), around ``mounts``.

    ``as_pid_1``: no bwrap init in the PID namespace; the program (or, as root, the
    inner bwrap) is its PID 1, so every process is reaped by its own parent and the
    caller's RUSAGE_CHILDREN counts the program (bwrap's init is never waited for).
    """
    common = ["--die-with-parent", "--new-session", *(["--as-pid-1"] if as_pid_1 else []),
              *mounts]
    if drop_to is None:
        return [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", *common, *chdir, "--"]
    uid, gid = drop_to
    outer = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
             "--unshare-cgroup-try",
             # Just enough for setpriv to change uid, gid and groups and drop the bounding set.
             "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
             "--cap-add", "CAP_SETPCAP", *common]
    drop = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all",
            # As PID 1 nothing else dies with bwrap: changing uid cleared the death signal
            # bwrap set, so set it again (util-linux 2.33+), or a kill leaves the run going.
            *(["--pdeathsig=SIGKILL"] if as_pid_1 else []), "--"]
    # The inner bwrap keeps the outer mount tree and adds the user namespace. --dev-bind,
    # because --bind would mark it nodev and break /dev/null; the outer mounts' own
    # nosuid/nodev/ro flags stay (a user namespace cannot clear them). Only the inner
    # one changes directory: the outer root kept no capability to enter a 0700
    # directory of the sandbox user's. It mounts its scratch tmpfs on /tmp, which must exist.
    inner = [bwrap, "--unshare-user", "--disable-userns", "--die-with-parent",
             "--dev-bind", "/", "/", *chdir, "--"]
    return [*outer, "--", *drop, *inner]


def system_mounts() -> list[str]:
    """Read-only /usr with the top-level links into it (the loader, libc), a private /proc
    and a minimal /dev: what any program needs."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _TOP_LEVEL:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    return args + ["--proc", "/proc", "--dev", "/dev"]


def prefix_mounts() -> list[str]:
    """The bot's Python installation, read-only, when ``/usr`` does not hold it. Mount it
    after any tmpfs, which would hide a prefix under /tmp."""
    prefix = interpreter_prefix()
    if prefix is None:
        return []
    # bwrap makes missing parents 0700 (unusable by the sandbox user): make them 0755
    # first. Only the prefix itself is bound: nothing else of its parents shows.
    args = []
    for parent in reversed(prefix.parents[:-1]):
        args += ["--perms", "0755", "--dir", str(parent)]
    return args + ["--ro-bind", str(prefix), str(prefix)]


def _mounts(workspace: Path, data_fds: dict[str, int], tmp_bytes: int) -> list[str]:
    args = system_mounts()
    # Private, sized tmpfs: RAM-backed, so the size is what bounds the memory they take.
    for tmp in ("/tmp", "/dev/shm"):
        args += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", tmp]
    args += prefix_mounts()
    args += ["--perms", "0755", "--dir", "/etc"]
    for path in _ETC_SHARED:
        args += ["--ro-bind-try", path, path]
    for path, fd in data_fds.items():
        args += ["--perms", "0444", "--ro-bind-data", str(fd), path]
    args += ["--bind", str(workspace), str(MOUNT_POINT)]
    # bwrap's root is a tmpfs owned by whoever runs bwrap (the bot's user, when not
    # root): without this, a program could fill RAM through /, /etc or /root.
    args += ["--remount-ro", "/"]
    return args
