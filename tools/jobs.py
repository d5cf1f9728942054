"""One channel's background Python jobs: the runner behind job_start, job_poll, job_stop, job_list.

A job is an asyncio task, owned by the channel's ``JobRunner``, that awaits
one ``Sandbox.run``. ``Sandbox.run`` hands back output only when the program
ends, so the job does not rely on it: inside the sandbox, ``sh`` redirects
the program's stdout and stderr into the workspace, ``jobs/<id>/stdout.txt``
and ``stderr.txt``, next to the code in ``jobs/<id>/main.py``. Python runs
unbuffered (``-u``), so ``job_poll`` shows output while the job runs, and the
output a job wrote survives the bot. The files are the agent's own: it can
read, change or delete them, and nothing the harness decides rests on them.

The records live in ``state_dir/jobs.json`` (outside the workspace; temp file
plus ``os.replace``): id, state, times, timeout, exit code, a note. States:
``running``, ``done`` (exit 0), ``failed`` (non-zero exit, or killed by a
limit), ``timed_out``, ``stopped`` (job_stop) and ``lost``.

``lost`` means the bot stopped while the job ran: the sandbox dies with the
bot (``--die-with-parent``), so a new runner, which starts no process on
load, marks every job recorded as running by another runner as lost, and
takes it over. ``close()`` (bot shutdown) kills its own jobs and marks them
lost the same way. Each runner has an owner token, and writes only records
it owns, so a runner that lingers after being replaced cannot overwrite
``lost`` with a late result.

Not covered: the files a job changes are not journaled (a job runs for long,
interleaved with the agent's journaled edits, so its own changes cannot be
told apart cleanly). ``undo`` cannot revert them, and it still refuses to
overwrite a file a job changed. An output file is bounded only by the
sandbox's RLIMIT_FSIZE (``Limits.file_size_mb``, 100 MiB by default).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

from sandbox.paths import Workspace
from sandbox.process import Sandbox, SandboxUnavailable
from tools import ToolError
from tools.fsroot import FsRoot, atomic_write
from tools.programs import check_available, with_timeout

logger = logging.getLogger("nightshift.tools.jobs")

JOBS_FILE = "jobs.json"
JOBS_DIR = "jobs"
KEEP_RECORDS = 50  # finished records past this many are forgotten (their files stay)
TAIL_BYTES = 64 * 1024  # job_poll reads at most this much of the end of each output file
_LAUNCH = 'exec python3 -u "$1" >"$2" 2>"$3"'
# After a kill, a moment for the dead sandbox's pipes to reach end-of-file, so asyncio closes
# their transports on the running loop (not at garbage collection, after the loop is gone).
_SETTLE_S = 0.2


class JobSlots:
    """Caps on the jobs running at once, per channel and over all channels together.

    One instance is shared by every channel's runner (``ctx.services.job_slots``):
    without it, each channel could start jobs until the machine gave out."""

    def __init__(self, per_channel: int, total: int) -> None:
        self.per_channel, self.total = per_channel, total
        self._running: dict[str, set[str]] = {}  # runner owner -> its running job ids

    def take(self, owner: str, job_id: str) -> None:
        """Reserve a slot for a job, or raise ToolError saying which cap is reached."""
        mine = self._running.get(owner, set())
        if len(mine) >= self.per_channel:
            raise ToolError(f"{len(mine)} jobs already run in this channel, the most allowed "
                            f"at once ({self.per_channel}); wait for one (job_poll) or stop one "
                            "(job_stop) first")
        if sum(map(len, self._running.values())) >= self.total:
            raise ToolError(f"{self.total} jobs already run over all channels, the most "
                            "allowed at once; try again later, or use run_python for short work")
        self._running.setdefault(owner, set()).add(job_id)

    def give_back(self, owner: str, job_id: str) -> None:
        self._running.get(owner, set()).discard(job_id)


class JobRunner:
    """Starts, watches, stops and remembers one channel's background jobs."""

    def __init__(self, workspace: Workspace, state_dir: Path, sandbox: Sandbox,
                 slots: JobSlots | None = None) -> None:
        self.workspace = workspace
        self.path = Path(state_dir) / JOBS_FILE
        self.sandbox = sandbox
        self.slots = slots
        self.owner = secrets.token_hex(8)
        self._tasks: dict[str, asyncio.Task] = {}
        self._stopping: set[str] = set()
        self._recover()

    # --- the API the tools use ---

    def start(self, code: str, timeout_s: float) -> dict[str, Any]:
        """Write the code, record the job and start its task (call on the event loop)."""
        check_available(self.sandbox)
        data = self._load()
        job_id = f"j{data['next_id']}"
        if self.slots is not None:
            self.slots.take(self.owner, job_id)
        try:
            data["next_id"] += 1
            folder = f"{JOBS_DIR}/{job_id}"
            fs = FsRoot(self.workspace.root)
            fs.write(f"{folder}/main.py", code.encode("utf-8"), parents=True)
            for name in ("stdout.txt", "stderr.txt"):  # empty until the program writes
                fs.write(f"{folder}/{name}", b"")
        except BaseException:
            self._give_back(job_id)
            raise
        record = {"id": job_id, "state": "running", "started": time.time(), "ended": None,
                  "timeout_s": timeout_s, "exit_code": None, "note": "", "folder": folder,
                  "owner": self.owner}
        data["jobs"][job_id] = record
        self._save(data)
        task = asyncio.get_running_loop().create_task(self._run(job_id, folder, timeout_s),
                                                      name=f"job {job_id}")
        self._tasks[job_id] = task
        task.add_done_callback(lambda _t: (self._tasks.pop(job_id, None), self._give_back(job_id)))
        return record

    def _give_back(self, job_id: str) -> None:
        if self.slots is not None:
            self.slots.give_back(self.owner, job_id)

    def get(self, job_id: str) -> dict[str, Any]:
        record = self._load()["jobs"].get(job_id)
        if record is None:
            known = ", ".join(self._load()["jobs"]) or "none yet"
            raise ToolError(f"there is no job {job_id!r}; the jobs are: {known}. job_list shows them")
        return record

    def records(self) -> list[dict[str, Any]]:
        """Every remembered job, oldest first."""
        return list(self._load()["jobs"].values())

    def tail(self, record: dict[str, Any], name: str, lines: int) -> str:
        """The last ``lines`` lines of a job's output file, read without following links."""
        rel = f"{record['folder']}/{name}"
        try:
            fd = self.workspace.open(rel)
        except (OSError, ValueError) as exc:
            return f"[{rel} cannot be read: {exc}]"
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(fd).st_size
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read(TAIL_BYTES)
        text = data.decode("utf-8", errors="replace")
        kept = text.splitlines()[-lines:] if text else []
        return "\n".join(kept)

    async def stop(self, job_id: str) -> dict[str, Any]:
        """Kill a running job; its record says ``stopped``."""
        record = self.get(job_id)
        task = self._tasks.get(job_id)
        if record["state"] != "running" or task is None:
            return record
        self._stopping.add(job_id)
        task.cancel()
        await asyncio.wait({task}, timeout=10)
        await asyncio.sleep(_SETTLE_S)
        if task.done() and self.get(job_id)["state"] == "running":
            # Cancelled before its first step: _run never ran to record the stop.
            self._finish(job_id, "stopped", None, "stopped by job_stop")
        return self.get(job_id)

    async def close(self) -> None:
        """Bot shutdown: kill every job of this runner; their records say ``lost``."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(_SETTLE_S)

    def summary(self) -> list[dict[str, Any]]:
        """Short records for the health tool: running jobs first, then the latest ended ones."""
        now = time.time()
        out = []
        for r in sorted(self.records(), key=lambda r: (r["state"] != "running", -r["started"])):
            end = r["ended"] or now
            out.append({"id": r["id"], "state": r["state"], "seconds": round(end - r["started"], 1),
                        "exit_code": r["exit_code"]})
        return out

    # --- the job itself ---

    async def _run(self, job_id: str, folder: str, timeout_s: float) -> None:
        argv = ["sh", "-c", _LAUNCH, "sh", f"{folder}/main.py", f"{folder}/stdout.txt",
                f"{folder}/stderr.txt"]
        box = with_timeout(self.sandbox, timeout_s)
        where = "/workspace" if getattr(box, "sandboxed", True) else str(self.workspace.root)
        try:
            result = await box.run(argv, self.workspace, timeout_s=timeout_s,
                                   env={"PYTHONPATH": where})
        except asyncio.CancelledError:
            if job_id in self._stopping:
                self._finish(job_id, "stopped", None, "stopped by job_stop")
            else:
                self._finish(job_id, "lost", None, "the bot shut down while it ran")
            raise
        except SandboxUnavailable as exc:
            self._finish(job_id, "failed", None, str(exc))
            return
        except Exception as exc:  # a harness bug: keep the record honest, keep the bot up
            logger.exception("job %s failed inside the harness", job_id)
            self._finish(job_id, "failed", None, f"the harness failed: {type(exc).__name__}: {exc}")
            return
        if result.timed_out:
            state, note = "timed_out", f"killed after its {timeout_s:g} s timeout"
        elif result.returncode == 0:
            state, note = "done", ""
        else:
            state = "failed"
            note = f"killed by signal {result.returncode - 128}" if result.killed else ""
        launcher = result.stderr.strip()  # only sh or the sandbox itself write here
        if launcher:
            note = f"{note}; {launcher[-500:]}" if note else launcher[-500:]
        self._finish(job_id, state, result.returncode, note)

    def _finish(self, job_id: str, state: str, exit_code: int | None, note: str) -> None:
        self._stopping.discard(job_id)
        data = self._load()
        record = data["jobs"].get(job_id)
        if record is None or record.get("owner") != self.owner:
            return  # another runner took it over (and called it lost), or it was forgotten
        record.update(state=state, ended=time.time(), exit_code=exit_code, note=note)
        self._save(data)

    # --- jobs.json ---

    def _recover(self) -> None:
        """Mark jobs that another runner (a previous bot) left running as lost."""
        data = self._load()
        changed = False
        for record in data["jobs"].values():
            if record["state"] == "running" and record.get("owner") != self.owner:
                record.update(state="lost", ended=time.time(), owner=self.owner,
                              note="the bot restarted while it ran; the output it wrote is kept")
                changed = True
        if changed:
            self._save(data)

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"version": 1, "next_id": 1, "jobs": {}}
        except ValueError:
            logger.warning("%s is not valid JSON; starting a fresh job list", self.path)
            return {"version": 1, "next_id": 1, "jobs": {}}
        return data

    def _save(self, data: dict[str, Any]) -> None:
        jobs = data["jobs"]
        ended = [k for k, r in jobs.items() if r["state"] != "running"]
        for job_id in ended[:max(0, len(jobs) - KEEP_RECORDS)]:
            del jobs[job_id]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(data, indent=1).encode())
