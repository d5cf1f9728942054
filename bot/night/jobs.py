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
    from bot.config import Config

# The states of a night that is queued or under way (the trainer writes them).
ACTIVE = ("queued", "running", "judging", "training", "exporting", "gating")
STAGES = ("collect", "judge", "value", "understand", "advantages", "train (LoRA, OAPL+ECHO)",
          "export (merge, q8_0 GGUF)", "gate (held-out eval)", "release")


def start_trainer(config: Config, job_id: int) -> subprocess.Popen:
    """Launch the night process for a job; its output goes to data/logs/night-N.log."""
    logs = config.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "trainer"]
    if config.source is not None:
        argv += ["--config", str(config.source)]
    argv += ["sleep", "--job", str(job_id)]
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


def reap(child: subprocess.Popen) -> None:
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def stop_trainer(pid: int | None) -> None:
    if pid_alive(pid):
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass


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
