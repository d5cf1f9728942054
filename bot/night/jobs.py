"""A night is a job row in the store, run by a separate trainer process.

The bot never imports the trainer: ``start_trainer`` launches ``python -m
trainer sleep --job N`` in its own session with its own log file, so a crashed
trainer can never take the bot down. This module holds what the admin
commands and the night watch both need to know about such a job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.config import Config

# The states of a night that is queued or under way (the trainer writes them).
ACTIVE = ("queued", "running", "judging", "training", "exporting", "gating")
STAGES = ("collect", "judge", "value", "understand", "advantages",
          "gate: the live model's answers", "train (LoRA, OAPL+ECHO)",
          "export (merge, q8_0 GGUF)", "gate: the candidate's answers, paired", "release")


def start_trainer(config: Config, job_id: int) -> subprocess.Popen:
    """Launch the night process for a job; its output goes to data/logs/night-N.log."""
    logs = config.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "trainer"]
    if config.source is not None:
        argv += ["--config", str(config.source)]
    argv += ["sleep", "--job", str(job_id), "--bot-serves"]  # never a second server on its port
    with open(logs / f"night-{job_id}.log", "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def is_trainer(pid: int | None, job_id: int) -> bool:
    """True when ``pid`` is alive and is a night's trainer for ``job_id``.

    A job row's pid outlives the bot: after a restart (or a reboot) the number
    may belong to some other process by now, and signalling its process group
    would hit a stranger. So the pid counts only when its command line is
    ``python -m trainer ... sleep`` and, if it names a job (``--job N``), names this one."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except FileNotFoundError:
        return False  # exited meanwhile
    except OSError:
        return False  # not ours to read, so not ours to signal
    module = any(argv[i:i + 2] == ["-m", "trainer"] for i in range(len(argv)))
    if not module or "sleep" not in argv:
        return False
    if "--job" in argv:
        i = argv.index("--job")
        return argv[i + 1:i + 2] == [str(job_id)]
    return True


def reap(child: subprocess.Popen) -> None:
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def stop_trainer(pid: int | None, job_id: int) -> bool:
    """SIGTERM the trainer of ``job_id`` (its process group when it leads one); False
    when ``pid`` is not that trainer, which is then left alone."""
    if not is_trainer(pid, job_id):
        return False
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGTERM)
        else:  # started by hand (python -m trainer sleep): its group is the shell's
            os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def night_line(job: dict) -> str:
    """One line of a night's progress, for Discord and the console alike."""
    progress = job.get("progress") or {}
    parts = [f"Night #{job['id']}: {job['state']}"]
    if step := progress.get("train_step"):
        parts.append(f"step {step.get('step')}/{step.get('steps')}, OAPL {step.get('oapl', 0):.4f}")
    if counts := progress.get("counts"):
        parts.append(f"{counts.get('windows_judged', 0)} windows judged, "
                     f"{counts.get('subtasks', 0)} sub-tasks")
    if gate := progress.get("gate"):
        outcome = gate.get("outcome") or ("promote" if gate.get("passed") else "reject")
        parts.append(f"gate: {outcome} ({'; '.join(gate.get('reasons', []))})")
    if job.get("error"):
        parts.append(job["error"].splitlines()[0][:300])
    return " · ".join(parts)
