"""Run a program in a channel's workspace, sandboxed. What is covered, and what is not.

The agent is untrusted code. ``Sandbox.run`` runs its programs (Python, git)
with bubblewrap and reports what happened as a ``ProcessResult``; nothing the
program does raises.

Covered (each line has adversarial probes in tests/test_sandbox_escapes.py;
timeouts and leftovers are in tests/test_sandbox_process.py):

- Files: the program sees read-only ``/usr`` (with the top-level links into
  it), the bot's Python installation read-only when it lives outside ``/usr``
  (so ``python3`` is the bot's interpreter, standard library only), a
  private ``/proc``, a minimal ``/dev``, private size-capped tmpfs ``/tmp``
  and ``/dev/shm``, a synthetic ``/etc`` (passwd and group naming only the
  sandbox user, the loader cache, Debian's alternatives links) and the
  workspace, read-write, at ``/workspace`` (the working directory and
  ``$HOME``). Nothing else of the host: not ``/root``, ``/home``, the
  repository, the bot's data, ``/etc/shadow``, the host's ``/tmp`` or
  ``/dev/shm``. Symlinks and hard links made inside resolve in this view.
- Identity: a non-root host uid (``nightshift-sandbox`` when the bot is root,
  else the bot's own user), no capabilities, no supplementary groups,
  ``no_new_privs`` (setuid binaries gain nothing), no new user namespaces,
  so no ``mount``. As root, the bot hands the workspace to that user before
  each run (``sandbox.bwrap.hand_over``), so programs can change its files.
- Network: none. A private network namespace holds only its own loopback.
  Abstract Unix sockets are per namespace, and host Unix sockets are not
  visible.
- Processes: a private PID namespace: host processes cannot be seen,
  signalled or traced, nor their ``/proc/PID/environ`` read.
- Environment: only PATH, HOME, LANG, TMPDIR, PYTHONDONTWRITEBYTECODE and
  what the caller passes; never the bot's own (which holds its tokens).
- Resources: RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC and
  RLIMIT_NOFILE from ``Limits``; stdout and stderr each keep at most
  ``output_bytes`` (the first and last halves; the rest is read and thrown
  away, the program is not stopped for it); a wall-clock timeout.
- Leftovers: none. The PID namespace dies with its first process, which
  dies with bwrap (``--die-with-parent``), and a timeout kills bwrap's
  process group; so background children die when the program ends.

Not covered:

- The kernel. There is no seccomp filter: every system call except making
  user namespaces reaches the kernel, so a kernel bug is an escape.
- Total memory and disk are bounded in ``sandbox.shared_limits``: a memory
  cgroup for all runs where the machine has one (else a budget of runs), and
  the workspace quota and ``sandbox.disk_budget`` watched while a program runs.
  Without the cgroup, a run's children are bounded only by their own RLIMIT_AS.
- Total CPU: RLIMIT_CPU is per process; only the timeout bounds the sum.
- RLIMIT_NPROC counts every process of the uid, so each run gets the uid's
  current count plus ``Limits.processes``, and runs of several channels
  (same uid) are not isolated from each other's counts.
- Information: the kernel version, /proc/cpuinfo, /proc/meminfo, the
  installed packages under /usr, the host paths of the workspace and the
  interpreter (in /proc/self/mountinfo) and timing are visible.
- The workspace persists between runs and the file tools read it, so a
  program can leave symlinks or FIFOs there: ``sandbox.paths`` handles those.
  A Unix socket that the host itself put in the workspace would be reachable.
- Unsandboxed mode (bwrap missing and ``allow_unsandboxed``): only the
  rlimits, the timeout, the output caps and the working directory hold. The
  program runs as the bot's user, sees the whole host and the network, and
  one that calls setsid() can outlive the timeout. As root, RLIMIT_NPROC
  does not bind. ``unsandboxed_warning`` is what the bot prints at start.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import resource
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.bwrap import (
    HOST_PATH,
    SandboxUnavailable,
    bwrap_argv,
    etc_files,
    find_bwrap,
    hand_over,
    interpreter_prefix,
    missing_message,
    setup_user,
)
from sandbox.disk_budget import DiskBudget
from sandbox.paths import MOUNT_POINT, Workspace
from sandbox.shared_limits import MemoryBudget, over_quota_message, usage_bytes

__all__ = ["Limits", "ProcessResult", "Sandbox", "SandboxUnavailable", "find_bwrap",
           "setup_user", "unsandboxed_warning", "warning"]

_MIB = 1 << 20
_CHUNK = 64 * 1024
# After a kill, how long stray pipe holders (unsandboxed mode only) may keep the output open.
_GRACE_S = 2.0
_BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 30  # RLIMIT_CPU per process; SIGXCPU, then SIGKILL a second later
    address_space_mb: int = 1024  # RLIMIT_AS per process
    file_size_mb: int = 100  # RLIMIT_FSIZE: the largest file a program may write
    processes: int = 64  # RLIMIT_NPROC, on top of the uid's processes at start
    open_files: int = 256  # RLIMIT_NOFILE
    output_bytes: int = _MIB  # kept of stdout, and of stderr
    timeout_s: float = 30.0  # wall clock, then the whole sandbox is killed
    tmp_mb: int = 64  # each of the private tmpfs /tmp and /dev/shm
    workspace_mb: int | None = None  # the workspace's disk quota, watched during a run


@dataclass
class ProcessResult:
    ok: bool  # exit status 0 and no timeout
    returncode: int  # shell convention: 128 + N when signal N ended it
    stdout: str
    stderr: str
    timed_out: bool  # the wall-clock timeout struck and everything was killed
    killed: bool  # ended by a signal: our kill on timeout, or an rlimit (CPU)
    truncated: bool  # stdout or stderr went past Limits.output_bytes
    duration_s: float
    sandboxed: bool  # False only in the explicitly allowed unsandboxed mode


def warning() -> str:
    """What the bot prints at every start when code runs unsandboxed."""
    return ("WARNING: bubblewrap is missing and sandbox.allow_unsandboxed = true: the agent's "
            "code runs WITHOUT a sandbox, as the bot's user, with the host's files and network. "
            "Only rlimits, timeouts and output caps apply. Install bubblewrap 0.8+ "
            "(apt-get install bubblewrap) and set allow_unsandboxed = false.")


def unsandboxed_warning(allow_unsandboxed: bool) -> str | None:
    """None when code runs sandboxed; otherwise the line the bot prints at start."""
    if find_bwrap() is not None:
        return None
    if allow_unsandboxed:
        return warning()
    return missing_message() + " Until then the Python and git tools refuse to run."


@dataclass
class _Launch:
    """How to start one run: argv, environment, working directory, fds to pass."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    nproc: int
    fds: list[int] = field(default_factory=list)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


class Sandbox:
    """Runs programs in workspaces: sandboxed by bwrap, or refused when bwrap is missing."""

    def __init__(self, allow_unsandboxed: bool = False, limits: Limits = Limits(),
                 memory: MemoryBudget | None = None, disk: DiskBudget | None = None) -> None:
        self.allow_unsandboxed = allow_unsandboxed
        self.limits = limits
        self.memory = memory  # shared by every channel's runs (and by copies of this box)
        self.disk = disk  # the data folder's budget, shared as the memory is
        self.bwrap = find_bwrap()
        self._user: tuple[int, int] | None = None  # the sandbox user's ids, once set up

    @property
    def sandboxed(self) -> bool:
        return self.bwrap is not None

    async def run(self, argv: list[str], workspace: Workspace, *, stdin: str | None = None,
                  timeout_s: float | None = None, env: dict[str, str] | None = None,
                  ) -> ProcessResult:
        """Run ``argv`` in ``workspace`` and report what happened.

        Nothing the program does raises. ``SandboxUnavailable`` means code
        cannot run here (no bwrap and unsandboxed mode not allowed); a
        ``TypeError`` means a malformed argv or env, a bug in the caller.

        ``argv[0]`` is looked up on the sandbox's PATH: ``python3`` is the
        bot's interpreter (standard library only); host paths such as the
        bot's venv do not exist inside. ``timeout_s`` overrides
        ``Limits.timeout_s``; ``env`` adds to the minimal environment.
        """
        timeout = self.limits.timeout_s if timeout_s is None else timeout_s
        launch = await self._launch(list(argv), workspace, env or {})
        started = time.monotonic()
        reserve = (self.memory.reserve(self.limits.address_space_mb) if self.memory
                   else contextlib.nullcontext(True))
        async with reserve as granted:
            if not granted:
                launch.close()
                return self._result(125, "", self.memory.busy_message(), False, False, started)
            return await self._run(launch, argv, workspace, stdin, timeout, started)

    async def _run(self, launch: _Launch, argv: list[str], workspace: Workspace,
                   stdin: str | None, timeout: float, started: float) -> ProcessResult:
        cgroup = self.memory.cgroup_procs if self.memory else None
        try:
            proc = await asyncio.create_subprocess_exec(
                *launch.argv, cwd=launch.cwd, env=launch.env, pass_fds=launch.fds,
                stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # one process group to kill on timeout
                # Python code between fork and exec: keep it to setrlimit calls.
                preexec_fn=_rlimits(self.limits, launch.nproc, cgroup),
            )
        except OSError as exc:  # e.g. no such program (unsandboxed mode)
            return self._result(127, "", f"cannot start {argv[0]!r}: {exc}", False, False, started)
        finally:
            launch.close()
        quota, disk = self.limits.workspace_mb, self.disk
        watch = (asyncio.create_task(_watch_disk(proc, workspace.root, quota, disk))
                 if quota or disk else None)
        try:
            out, err, timed_out = await _collect(proc, stdin, timeout, self.limits.output_bytes)
        finally:
            if proc.returncode is None:  # cancelled, or timed out: take everything down
                _kill_group(proc)
            if watch is not None:
                watch.cancel()
        returncode = await proc.wait()
        stderr = err.decode()
        if watch is not None and watch.done() and not watch.cancelled() and watch.result():
            stderr += f"\n[stopped: {watch.result()}]"
        return self._result(returncode, out.decode(), stderr, timed_out,
                            out.truncated or err.truncated, started)

    def run_sync(self, argv: list[str], workspace: Workspace, **kwargs) -> ProcessResult:
        """``run`` for scripts and tests that have no event loop.

        Call it from a thread that outlives the run: bwrap's --die-with-parent
        watches the thread that started it, not the process.
        """
        return asyncio.run(self.run(argv, workspace, **kwargs))

    def _result(self, returncode: int, stdout: str, stderr: str, timed_out: bool,
                truncated: bool, started: float) -> ProcessResult:
        if returncode < 0:  # killed by a signal: report 128 + N, as bwrap does
            returncode = 128 - returncode
        return ProcessResult(
            ok=returncode == 0 and not timed_out, returncode=returncode,
            stdout=stdout, stderr=stderr, timed_out=timed_out,
            killed=timed_out or returncode > 128, truncated=truncated,
            duration_s=time.monotonic() - started, sandboxed=self.sandboxed,
        )

    async def _launch(self, argv: list[str], workspace: Workspace, extra: dict[str, str],
                      ) -> _Launch:
        if not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError(f"argv must be a non-empty list of strings, not {argv!r}")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items()):
            raise TypeError("env must map strings to strings")
        if self.bwrap is None:
            if not self.allow_unsandboxed:
                raise SandboxUnavailable(missing_message())
            env = {"PATH": f"{Path(sys.base_prefix) / 'bin'}:{_BASE_PATH}",
                   "HOME": str(workspace.root), **_COMMON_ENV, **extra}
            nproc = self.limits.processes + await asyncio.to_thread(_tasks_of, os.getuid())
            return _Launch(argv, env, str(workspace.root), nproc)
        drop_to, setpriv = None, None
        ids = (os.getuid(), os.getgid())
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv", path=HOST_PATH)
            if setpriv is None:
                raise SandboxUnavailable("setpriv (util-linux) is missing: as root, the sandbox "
                                         "needs it to drop to an unprivileged user")
            if self._user is None:
                self._user = await asyncio.to_thread(setup_user)
            ids = drop_to = self._user
            await asyncio.to_thread(hand_over, workspace.root, *drop_to)
        nproc = self.limits.processes + await asyncio.to_thread(_tasks_of, ids[0])
        fds = {path: _pipe_holding(text) for path, text in etc_files(*ids).items()}
        cmd = bwrap_argv(self.bwrap, workspace=workspace.root, data_fds=fds,
                         tmp_bytes=self.limits.tmp_mb * _MIB, drop_to=drop_to, setpriv=setpriv)
        prefix = interpreter_prefix()
        path = f"{prefix / 'bin'}:{_BASE_PATH}" if prefix else _BASE_PATH
        env = {"PATH": path, "HOME": str(MOUNT_POINT), "TMPDIR": "/tmp", **_COMMON_ENV, **extra}
        return _Launch(cmd + argv, env, None, nproc, list(fds.values()))


_COMMON_ENV = {"LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


class _Capture:
    """The first and last halves of a stream, at most ``limit`` bytes in all."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_size = 0
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail.append(chunk)
        self.tail_size += len(chunk)
        # Drop whole chunks while the rest still fills the tail: no quadratic copying.
        while self.tail_size - len(self.tail[0]) >= self.tail_limit:
            self.tail_size -= len(self.tail.popleft())

    @property
    def truncated(self) -> bool:
        return self.total > self.head_limit + self.tail_limit

    def decode(self, encoding: str = "utf-8", errors: str = "replace") -> str:
        tail = b"".join(self.tail)[-self.tail_limit:] if self.tail_limit else b""
        if not self.truncated:
            return (bytes(self.head) + tail).decode(encoding, errors)
        omitted = self.total - len(self.head) - len(tail)
        return (self.head.decode(encoding, errors) + f"\n[... {omitted} bytes omitted ...]\n"
                + tail.decode(encoding, errors))


async def _collect(proc: asyncio.subprocess.Process, stdin: str | None, timeout: float,
                   limit: int) -> tuple[_Capture, _Capture, bool]:
    """Feed stdin, read both outputs and wait, up to ``timeout``; kill on timeout."""
    out, err = _Capture(limit), _Capture(limit)
    tasks = [asyncio.create_task(_pump(proc.stdout, out)),
             asyncio.create_task(_pump(proc.stderr, err)),
             asyncio.create_task(proc.wait())]
    if stdin is not None:
        tasks.append(asyncio.create_task(_feed(proc.stdin, stdin)))
    try:
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        timed_out = bool(pending)
        if pending:
            _kill_group(proc)
            # Sandboxed, everything is dead now and the pipes close at once.
            await asyncio.wait(pending, timeout=_GRACE_S)
    finally:
        for task in tasks:
            task.cancel()
    return out, err, timed_out


async def _pump(stream: asyncio.StreamReader, capture: _Capture) -> None:
    while chunk := await stream.read(_CHUNK):
        capture.feed(chunk)


async def _feed(writer: asyncio.StreamWriter, text: str) -> None:
    try:
        writer.write(text.encode())
        await writer.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the program did not read all of its input; that is its business
    finally:
        writer.close()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # Sandboxed, the group is the outer bwrap and its PID-namespace init: killing
    # them ends the namespace, and the kernel kills everything in it.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _watch_disk(proc: asyncio.subprocess.Process, root: Path, quota_mb: int | None,
                      disk: DiskBudget | None) -> str:
    """Stop ``proc`` once the workspace grows past its quota, or past where it started when
    over it (a program that deletes files may still run), or grows while ``disk`` is full."""
    quota = quota_mb * _MIB if quota_mb else None
    start = await asyncio.to_thread(usage_bytes, root)
    while True:
        began = time.monotonic()
        used = await asyncio.to_thread(usage_bytes, root)
        full = (over_quota_message(used, quota) if quota and used > max(quota, start) else
                disk.watch(root, used, grew=used > start) if disk else None)
        if full:
            _kill_group(proc)
            return full
        # A large workspace takes a while to walk: poll less often rather than spin a core.
        await asyncio.sleep(max(disk.poll_s(root) if disk else 0.25, 4 * (time.monotonic() - began)))


def _rlimits(limits: Limits, nproc: int, cgroup_procs: Path | None = None):
    """The function the child runs before exec: set the rlimits and join the memory
    cgroup (descendants inherit it), nothing else."""
    wanted = {
        resource.RLIMIT_CPU: (limits.cpu_s, limits.cpu_s + 1),
        resource.RLIMIT_AS: (limits.address_space_mb * _MIB,) * 2,
        resource.RLIMIT_FSIZE: (limits.file_size_mb * _MIB,) * 2,
        resource.RLIMIT_NPROC: (nproc,) * 2,
        resource.RLIMIT_NOFILE: (limits.open_files,) * 2,
    }
    # Computed here, not in the child: a non-root parent cannot raise its hard limits.
    pairs = []
    for which, (soft, hard) in wanted.items():
        _, current = resource.getrlimit(which)
        if current != resource.RLIM_INFINITY:
            soft, hard = min(soft, current), min(hard, current)
        pairs.append((which, (soft, hard)))

    def apply() -> None:
        for which, value in pairs:
            resource.setrlimit(which, value)
        if cgroup_procs is not None:
            try:
                fd = os.open(cgroup_procs, os.O_WRONLY)
                os.write(fd, b"0")  # "0": the writing process itself
                os.close(fd)
            except OSError:
                pass  # removed meanwhile: the rlimits still hold

    return apply


def _tasks_of(uid: int) -> int:
    """How many tasks (threads count) ``uid`` runs now: RLIMIT_NPROC counts them all."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            with open(f"/proc/{entry.name}/status", "rb") as status:
                count += int(status.read().split(b"Threads:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue  # gone, or not ours to read
    return count


def _pipe_holding(text: str) -> int:
    """A pipe's read end holding ``text`` (small: it must fit the pipe buffer)."""
    read, write = os.pipe()
    try:
        os.write(write, text.encode())
    finally:
        os.close(write)
    return read
