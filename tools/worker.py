"""Untrusted bytes are parsed in a child process under limits, never in the bot's process.

Why: work on the agent's files used to run in the bot itself. ``grep``'s
``re`` holds the GIL while it backtracks, so ``(a+)+$`` froze every channel,
the Discord heartbeat and the watchdog for seconds (doubling per character).
``ast.parse`` of a 21 MB file took 67 s and 8.2 GiB. pypdf and Pillow are
large parsers of hostile formats: a 300 KB ICO decodes a 324 MB PNG when it
is merely opened.

How: ``run(task, args, data)`` starts ``python -P tools/parsers.py TASK MB CPU``
with the bot's own interpreter (so pypdf and Pillow import; ``-S`` too, no
site-packages, for the tasks that need only the standard library), ``-P``
(no script folder on ``sys.path``), working directory ``/``, a new session
and an environment holding nothing of the bot's (not its tokens). The child
(``tools.parsers``, which imports no ``tools`` module) sets its own rlimits
before it reads anything: RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_FSIZE 0 (it
writes no file) and RLIMIT_CORE 0. It reads a JSON line of arguments and then
the data from stdin, runs the task and writes one JSON object to stdout. The
parent waits ``Limits.timeout_s`` at most, then kills the session. The calling
thread (tools run in ``asyncio.to_thread``) only waits on pipes, so the GIL
stays free and the event loop runs on.

Results: the task's JSON value. A ``ToolError`` with a clear message when the
task refused (a ToolError or ValueError in the child) or the child ran out of
memory, CPU or time, or crashed on the input. A ``RuntimeError`` for a bug in
the task (any other exception), which the registry reports as the harness's.

Tasks come from a fixed table (``tools.parsers.TASKS``): nothing named on
the command line is imported. The cost is a process start per call (about
30 ms of CPU; bench/hostile.py prints it).

Not covered: the child runs as the bot's user, outside bubblewrap (the
sandbox's interpreter has no pypdf or Pillow). A memory-corruption exploit in
a parser's C code would run with the bot's file access, though not its
environment. The limits bound what a parse costs, not what an exploit can do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools import ToolError

PROGRAM = str(Path(__file__).with_name("parsers.py"))
# task -> whether it needs site-packages (pypdf, Pillow); the others start faster without.
TASKS = {"grep": False, "outline": False, "pdf": True, "image": True, "probe": False}
_STDERR_TAIL = 2000


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 1024  # RLIMIT_AS of the child: its interpreter, imports and the parse
    cpu_s: int = 10  # RLIMIT_CPU: SIGXCPU, then SIGKILL a second later
    timeout_s: float = 15.0  # wall clock, then the child's session is killed


def run(task: str, args: dict, data: bytes = b"", *, what: str, hint: str = "",
        limits: Limits = Limits(), fds: tuple[int, ...] = ()) -> Any:
    """The value of ``task(args, data)`` computed in a limited child process.

    ``what`` names the work in error messages ("reading a.pdf"); ``hint`` says
    what the agent can do instead when a limit stops it. ``fds`` are open
    descriptors the child inherits under the same numbers (a workspace file or
    folder the caller opened through the jail), so the child needs no paths.
    """
    if task not in TASKS:
        raise KeyError(f"no worker task {task!r}")
    flags = ["-P"] if TASKS[task] else ["-P", "-S"]
    argv = [sys.executable, *flags, PROGRAM, task, str(limits.memory_mb), str(limits.cpu_s)]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
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
    return _result(proc.returncode, out, err, what, hint, limits)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
