"""No model server outlives the bot that started it.

A bot killed with SIGKILL (or an OOM kill, or a crash in C code) runs no
cleanup, and its llama.cpp server would keep running, holding the GPU memory
and the port, so that the next start fails with "port in use". Two guards:

- a parent-death signal: the server is started under ``setpriv --pdeathsig
  KILL`` (util-linux; or ``prctl(PR_SET_PDEATHSIG)`` in the child where
  setpriv is missing), so the kernel kills it when the bot's thread that
  started it dies. Linux only; elsewhere the second guard remains;
- a pid file per port under ``data_dir/run``: at the next start, a server
  recorded there that still runs with the same command line is a stale one of
  ours, and is killed before the port is checked. A pid reused by some other
  program has another command line and is left alone.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger("nightshift.server")

_PR_SET_PDEATHSIG = 1


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def popen_tied(argv: list[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv)``, killed by the kernel when this process's thread dies."""
    setpriv = shutil.which("setpriv")
    if setpriv and os.uname().sysname == "Linux":
        # setpriv sets the signal, then execs argv: the server's command line is argv.
        return subprocess.Popen([setpriv, "--pdeathsig", "KILL", "--", *argv], **kwargs)
    if os.uname().sysname == "Linux":
        return subprocess.Popen(argv, preexec_fn=_set_pdeathsig, **kwargs)
    return subprocess.Popen(argv, **kwargs)


def cmdline(pid: int) -> list[str] | None:
    """A process's command line, or None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a] or None


def running(pid: int) -> bool:
    """True until the process has exited: gone, or a zombie whose every thread has exited
    (its files, the port among them, are closed only when the last thread is gone).

    Not ``cmdline``: the kernel empties a dying process's command line (its memory)
    before it closes its files."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X"):
                    return True
        except (OSError, IndexError):
            continue
    return False


def record(pid_file: Path, pid: int, argv: list[str]) -> None:
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = pid_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": pid, "argv": argv}))
    os.replace(tmp, pid_file)


def forget(pid_file: Path) -> None:
    pid_file.unlink(missing_ok=True)


def stop_stale(pid_file: Path, wait_s: float = 10.0) -> int | None:
    """Kill the server ``pid_file`` names if it still runs as recorded; its pid, or None."""
    try:
        recorded = json.loads(pid_file.read_text())
        pid, argv = int(recorded["pid"]), [str(a) for a in recorded["argv"]]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        logger.warning("ignoring unreadable server pid file %s", pid_file)
        forget(pid_file)
        return None
    if cmdline(pid) != argv:
        forget(pid_file)  # gone, or the pid now belongs to another program
        return None
    logger.warning("killing a stale model server (pid %d) left by an earlier run", pid)
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + wait_s
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # until it has exited and closed its files (the port)
    forget(pid_file)
    return pid
