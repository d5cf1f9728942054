"""Untrusted bytes are parsed in a child process under limits, never in the bot's process.

Why: work on the agent's files used to run in the bot itself. ``grep``'s
``re`` holds the GIL while it backtracks, so ``(a+)+$`` froze every channel,
the Discord heartbeat and the watchdog for seconds (doubling per character).
``ast.parse`` of a 21 MB file took 67 s and 8.2 GiB. pypdf and Pillow are
large parsers of hostile formats: a 300 KB ICO decodes a 324 MB PNG when it
is merely opened.

How: ``run(task, args, data)`` runs ``tools/parsers.py`` sealed in bubblewrap
(``sandbox.sealed``): the bot's base interpreter runs ``/parse/parsers.py``
with ``-E -s -S`` (no environment variables, no site-packages; ``/parse``, the
script's folder, is the import path), an empty environment, working directory
``/``. For the pdf and image tasks the folders of pypdf, Pillow and Pillow's
vendored libraries, found where the bot imports them from (``__file__``), are
bound read-only beside it in ``/parse``; the other tasks get the standard
library only. As root, the outer bwrap binds them before it drops to the
sandbox user, so a venv or interpreter under a 0700 ``/root`` works, as long
as the files are world-readable (pip's and pyenv's defaults). The child
(``tools.parsers``, which imports no ``tools`` module) sets its own rlimits
before it reads anything: RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE 0 (it writes no
file), RLIMIT_CORE 0 and RLIMIT_NPROC 0 (no fork). It reads a JSON line of
arguments and the data from stdin, gets workspace files as descriptors the
bot opened through the jail (``fds``, inherited under the same numbers), and
writes one JSON object to stdout. The parent waits ``Limits.timeout_s`` at
most, then kills the child's PID namespace and bwrap. The calling thread
(tools run in ``asyncio.to_thread``) only waits on pipes, so the GIL stays
free and the event loop runs on.

Covered, against a parser exploited by its input (a memory-corruption bug in
pypdf's or Pillow's C code): that code runs as a non-root uid
(``nightshift-sandbox`` when the bot is root) with no capabilities, no
network and no environment, in its own PID namespace, so it cannot read the
bot's ``/proc/PID/environ`` (its tokens); it sees none of the bot's files but
parsers.py and those packages: not the data dir, the repository, ``/root``
or ``/etc``. tests/test_tools_worker_jail.py tries each, and bench/reliability.py's
sandbox category once more through the runtime.

Results: the task's JSON value. A ``ToolError`` with a clear message when the
task refused (a ToolError or ValueError in the child) or the child ran out of
memory, CPU or time, or crashed on the input. A ``RuntimeError`` for a bug in
the task (any other exception), which the registry reports as the harness's.

Tasks come from a fixed table (``tools.parsers.TASKS``): nothing named on
the command line is imported. The cost is a process start per call, with
bwrap (as root: bwrap, setpriv, bwrap) before the interpreter; bench/hostile.py
prints it.

Without bubblewrap, as for the rest of the sandbox: a ``ToolError`` that says
how to fix it, unless the caller passes the channel's ``Sandbox`` (``box``)
and it allows unsandboxed runs (``sandbox.allow_unsandboxed``); then the
child runs unsealed, as the bot's user with a minimal environment and only its
rlimits, and every call logs a warning.

Not covered: the kernel (no seccomp filter); what the descriptors passed down
allow (a folder's lets the child read the workspace below it, the agent's
own files); ``/usr`` and the interpreter's installation, which it can read;
what an exploit computes within the limits, and the answer it gives the bot
(one JSON object, read as data). As root, a folder grep first hands the
workspace to the sandbox user (``prepare_folder``), as every sandboxed
program run does; a file with several hard links is not handed over, and is
skipped when others may not read it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox.bwrap import SandboxUnavailable, find_bwrap, hand_over, missing_message, setup_user
from sandbox.sealed import sealed_command
from tools import ToolError

if TYPE_CHECKING:
    from sandbox.process import Sandbox

logger = logging.getLogger("nightshift.tools.worker")

PROGRAM = str(Path(__file__).with_name("parsers.py"))
# task -> whether it needs pypdf and Pillow; the others get the standard library only.
# "probe" reports what a task sees, "probe_packages" the same in the pdf and image tasks' jail.
TASKS = {"grep": False, "outline": False, "pdf": True, "image": True, "probe": False,
         "probe_packages": True}
# What the pdf and image tasks import, each with the folders of shared libraries its wheel
# vendors beside it (Pillow's extension modules load ../pillow.libs relative to themselves).
PACKAGES = {"pypdf": (), "PIL": ("pillow.libs",)}
SEALED_DIR = "/parse"  # inside the sandbox: parsers.py and the packages, nothing else
# No environment variables, no user or system site-packages, no bytecode to write, UTF-8
# stdio without LANG. Not -P: the script's folder, /parse, is the import path.
SEALED_FLAGS = ("-E", "-s", "-S", "-B", "-X", "utf8")
_UNSANDBOXED_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
_STDERR_TAIL = 2000


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 1024  # RLIMIT_AS of the child: its interpreter, imports and the parse
    cpu_s: int = 10  # RLIMIT_CPU: SIGXCPU, then SIGKILL a second later
    timeout_s: float = 15.0  # wall clock, then the child and its PID namespace are killed


def run(task: str, args: dict, data: bytes = b"", *, what: str, hint: str = "",
        limits: Limits = Limits(), fds: tuple[int, ...] = (), box: Sandbox | None = None) -> Any:
    """The value of ``task(args, data)`` computed in a sealed, limited child process.

    ``what`` names the work in error messages ("reading a.pdf"); ``hint`` says
    what the agent can do instead when a limit stops it. ``fds`` are open
    descriptors the child inherits under the same numbers (a workspace file or
    folder the caller opened through the jail), so the child needs no paths.
    ``box`` is the channel's sandbox: its bwrap (found once) and whether it
    allows unsandboxed runs; without it, bwrap is looked up and required.
    """
    if task not in TASKS:
        raise KeyError(f"no worker task {task!r}")
    argv, env = _command(task, limits, box, what)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd="/", env=env, start_new_session=True,
                            pass_fds=fds)
    try:
        out, err = proc.communicate(json.dumps(args).encode() + b"\n" + data,
                                    timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        proc.communicate()
        raise ToolError(f"{what} took longer than {limits.timeout_s:g} s and was stopped"
                        + (f"; {hint}" if hint else "")) from None
    finally:
        if proc.returncode is None:  # an exception on our side: leave nothing running
            _kill(proc)
            proc.wait()
    # bwrap reports its child's death by signal N as exit code 128 + N; the interpreter
    # itself never exits above 128.
    code = proc.returncode
    return _result(128 - code if code > 128 else code, out, err, what, hint, limits)


def prepare_folder(root: Path, box: Sandbox | None = None) -> None:
    """Before a task walks a folder of the workspace ``root``: as root, hand the workspace to
    the sandbox user, as every sandboxed program does, so the child (that user) can enter
    its folders (``Workspace`` makes the root 0700). Nothing otherwise."""
    if os.geteuid() == 0 and (box.bwrap if box is not None else find_bwrap()) is not None:
        try:
            hand_over(root, *setup_user())
        except SandboxUnavailable as exc:
            raise ToolError(f"files cannot be searched here: {exc}") from None


def _command(task: str, limits: Limits, box: Sandbox | None,
             what: str) -> tuple[list[str], dict[str, str]]:
    """The child's argv and environment: sealed, or unsandboxed where that is allowed."""
    tail = [task, str(limits.memory_mb), str(limits.cpu_s)]
    bwrap = box.bwrap if box is not None else find_bwrap()
    if bwrap is not None:
        program = f"{SEALED_DIR}/parsers.py"
        binds = {program: PROGRAM, **(_package_binds() if TASKS[task] else {})}
        try:
            return sealed_command(bwrap, binds, [_base_python(), *SEALED_FLAGS, program, *tail]), {}
        except SandboxUnavailable as exc:
            raise ToolError(f"{what} cannot run here: {exc}") from None
    if box is None or not box.allow_unsandboxed:
        raise ToolError(f"{what} cannot run here: untrusted files are parsed only in the "
                        f"sandbox, and {missing_message()}")
    logger.warning("%s: parsed WITHOUT a sandbox, as the bot's user (bubblewrap is missing "
                   "and sandbox.allow_unsandboxed = true)", what)
    # -P: the script's folder (tools/) is not on the import path; -S where no package is needed.
    flags = ["-P"] if TASKS[task] else ["-P", "-S"]
    return [sys.executable, *flags, PROGRAM, *tail], dict(_UNSANDBOXED_ENV)


def _base_python() -> str:
    """The bot's base interpreter (not the venv's link to it), which the sandbox binds."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _package_binds() -> dict[str, str]:
    """/parse/NAME -> the host folder of each package the bot would import (``__file__``'s
    folder, found without importing), and of its vendored libraries."""
    binds = {}
    for name, vendored in PACKAGES.items():
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue  # not installed: the task fails with an ImportError, as it would here
        folder = Path(next(iter(spec.submodule_search_locations)))
        for inside, host in ((name, folder), *((v, folder.parent / v) for v in vendored)):
            if host.is_dir():
                binds[f"{SEALED_DIR}/{inside}"] = str(host)
    return binds


def _kill(proc: subprocess.Popen) -> None:
    """Kill the child's PID namespace, then bwrap. The namespace's PID 1 (``--as-pid-1``)
    is bwrap's only child, and nothing ties its life to bwrap's: as root, changing uid
    cleared the death signal bwrap gave it. Killing it makes the kernel kill everything
    in the namespace."""
    for pid in _children(proc.pid):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue  # gone already
        try:
            if pid in _children(proc.pid):  # still bwrap's child, not a reused number
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(pidfd)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:  # gone, or a kernel without CONFIG_PROC_CHILDREN: scan for them
        pass
    found = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and int(Path(entry.path, "stat").read_text()
                                            .rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _result(returncode: int, out: bytes, err: bytes, what: str, hint: str,
            limits: Limits) -> Any:
    tail = err.decode("utf-8", "replace")[-_STDERR_TAIL:]
    try:
        reply = json.loads(out) if returncode == 0 else None
    except ValueError:
        reply = None
    advice = f"; {hint}" if hint else ""
    if isinstance(reply, dict) and "value" in reply:
        return reply["value"]
    if isinstance(reply, dict) and "refused" in reply:
        raise ToolError(reply["refused"])
    if (isinstance(reply, dict) and reply.get("memory")) or "MemoryError" in tail:
        raise ToolError(f"{what} needed more than {limits.memory_mb} MiB of memory and was "
                        f"stopped{advice}")
    if isinstance(reply, dict) and "bug" in reply:
        raise RuntimeError(f"worker task {what}: {reply['bug']}")
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        raise ToolError(f"{what} used more than {limits.cpu_s} s of CPU time and was "
                        f"stopped{advice}")
    status = (f"signal {signal.Signals(-returncode).name}" if returncode < 0
              else f"exit code {returncode}")
    last = tail.strip().splitlines()[-1:] or ["no message"]
    raise ToolError(f"{what} failed: the parser crashed on this input ({status}: {last[0]})")
