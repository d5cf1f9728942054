"""Untrusted bytes are parsed in a child process under limits, never in the bot's process.

Why: work on the agent's files used to run in the bot itself. ``grep``'s
``re`` holds the GIL while it backtracks, so ``(a+)+$`` froze every channel,
the Discord heartbeat and the watchdog for seconds (doubling per character).
``ast.parse`` of a 21 MB file took 67 s and 8.2 GiB. pypdf and Pillow are
large parsers of hostile formats: a 300 KB ICO decodes a 324 MB PNG when it
is merely opened.

How: ``run(task, args, data)`` starts ``python -m tools.worker TASK MB CPU``
with the bot's own interpreter (so pypdf and Pillow import), ``-P`` (no
working-directory entry on ``sys.path``), working directory ``/``, a new
session and an environment holding nothing of the bot's (not its tokens).
The child sets its own rlimits before it reads anything: RLIMIT_AS (memory),
RLIMIT_CPU, RLIMIT_FSIZE 0 (it writes no file) and RLIMIT_CORE 0. It reads a
JSON line of arguments and then the data from stdin, runs the task and writes
one JSON object to stdout. The parent waits ``Limits.timeout_s`` at most, then
kills the session. The calling thread (tools run in ``asyncio.to_thread``)
only waits on pipes, so the GIL stays free and the event loop runs on.

Results: the task's JSON value. A ``ToolError`` with a clear message when the
task refused (a ToolError or ValueError in the child) or the child ran out of
memory, CPU or time, or crashed on the input. A ``RuntimeError`` for a bug in
the task (any other exception), which the registry reports as the harness's.

Tasks come from a fixed table (``TASKS``): nothing named on the command line
is imported. The cost is a process start per call (see bench/hostile.py).

Not covered: the child runs as the bot's user, outside bubblewrap (the
sandbox's interpreter has no pypdf or Pillow). A memory-corruption exploit in
a parser's C code would run with the bot's file access, though not its
environment. The limits bound what a parse costs, not what an exploit can do.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools import ToolError

# task name -> (module, function); the function takes (args: dict, data: bytes).
TASKS = {
    "grep": ("tools.search", "grep_task"),
    "outline": ("tools.search", "outline_task"),
    "pdf": ("tools.media", "pdf_task"),
    "image": ("tools.media", "image_task"),
    "probe": ("tools.worker", "probe_task"),
}
_ROOT = str(Path(__file__).resolve().parents[1])  # where the tools package lives
_STDERR_TAIL = 2000
_MIB = 1 << 20


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
    argv = [sys.executable, "-P", "-m", "tools.worker", task, str(limits.memory_mb),
            str(limits.cpu_s)]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": _ROOT,
           "PYTHONDONTWRITEBYTECODE": "1"}
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


# --- the child ---


def _limit(memory_mb: int, cpu_s: int) -> None:
    for which, value in ((resource.RLIMIT_AS, memory_mb * _MIB), (resource.RLIMIT_CPU, cpu_s),
                         (resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_CORE, 0)):
        _, hard = resource.getrlimit(which)
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        # CPU: the soft limit sends SIGXCPU, the hard one a second later SIGKILL.
        top = soft + 1 if which == resource.RLIMIT_CPU and hard == resource.RLIM_INFINITY else soft
        resource.setrlimit(which, (soft, top))


def _reply(payload: dict) -> None:
    sys.stdout.write(json.dumps(payload))
    sys.stdout.flush()


def probe_task(args: dict, data: bytes) -> dict:
    """What a task sees: environment names, rlimits, working directory, open descriptors.
    For the tests and the benchmark; it reads nothing of the agent's."""
    limits = {name: resource.getrlimit(getattr(resource, name))[0]
              for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE")}
    return {"env": sorted(os.environ), "limits": limits, "cwd": os.getcwd(),
            "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")), "bytes": len(data),
            "sys_path": sys.path}


def main(argv: list[str]) -> int:
    task, memory_mb, cpu_s = argv[0], int(argv[1]), int(argv[2])
    _limit(memory_mb, cpu_s)
    module, function = TASKS[task]
    args = json.loads(sys.stdin.buffer.readline())
    data = sys.stdin.buffer.read()
    try:
        value = getattr(importlib.import_module(module), function)(args, data)
    except MemoryError:
        data = args = None  # give back what we can, to be able to answer at all
        _reply({"memory": True})
    except ValueError as exc:  # ToolError and the parsers' refusals
        _reply({"refused": str(exc)})
    except OSError as exc:  # reading through the inherited descriptor: no host paths in it
        _reply({"refused": f"reading failed: {exc.strerror or exc}"})
    except RecursionError:
        _reply({"refused": "the input is nested too deeply to parse"})
    except Exception as exc:
        _reply({"bug": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"})
    else:
        _reply({"value": value})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
