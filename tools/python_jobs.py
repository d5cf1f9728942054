"""Python tools: run a snippet and wait (run_python), or start a background job and check on it.

Code runs only through the channel's sandbox (tools.programs): ``python3`` is
the base interpreter with the standard library only, the working directory is
the workspace (``/workspace``, also on ``PYTHONPATH``, so the agent's own
modules import), there is no network, and a timeout ends it. Without
bubblewrap, and unless ``sandbox.allow_unsandboxed`` is set, every tool here
refuses and says how to fix it.

``run_python`` saves the code as ``scratch/run_python.py`` (the latest run's
code stays there for debugging) and records what the run changed in the
workspace as one journal entry, so ``undo`` reverts it; see tools.programs
for how, and for what is not recorded.

Background jobs belong to the channel's ``JobRunner`` (tools.jobs), kept in
``ctx.services.jobs_runner``; ``job_runner(ctx)`` makes it on first use and
also sets ``ctx.services.jobs`` for the health tool. The bot calls
``await runner.close()`` at shutdown. A job's file changes are not journaled.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sandbox.process import ProcessResult
from tools import ToolContext, ToolError, tool
from tools.fsroot import FsRoot
from tools.jobs import JobRunner
from tools.programs import (
    ProgramChanges,
    clip,
    refuse_when_full,
    run_program,
    sandbox_of,
    workspace_in_sandbox,
)

RUN_FILE = "scratch/run_python.py"
MAX_RUN_TIMEOUT_S = 300
MAX_JOB_TIMEOUT_S = 6 * 3600
MAX_TAIL_LINES = 200
STDOUT_CHARS = 8000
STDERR_CHARS = 4000


def job_runner(ctx: ToolContext) -> JobRunner:
    """The channel's job runner, made (and its jobs recovered) on first use."""
    runner = ctx.services.jobs_runner
    if runner is None:
        runner = JobRunner(ctx.workspace, ctx.state_dir, sandbox_of(ctx),
                           slots=ctx.services.job_slots)
        ctx.services.jobs_runner = runner
        if ctx.services.jobs is None:
            ctx.services.jobs = runner.summary
    return runner


# --- run_python ---


@tool
async def run_python(ctx: ToolContext, code: str, timeout_s: int = 30) -> str:
    """Run Python code in your sandboxed workspace and wait for it: returns the exit code,
    stdout and stderr. Standard library only, no network; the working directory is your
    workspace. Files the code creates, changes or deletes are journaled: undo reverts them.
    For anything longer than a few minutes use job_start.

    Args:
        code: The Python program to run (saved as scratch/run_python.py).
        timeout_s: Seconds before the program is killed, 1 to 300.
    """
    if timeout_s < 1:
        raise ToolError(f"timeout_s must be between 1 and {MAX_RUN_TIMEOUT_S}, got {timeout_s}")
    note = ""
    if timeout_s > MAX_RUN_TIMEOUT_S:
        note = f"(timeout_s {timeout_s} is above the limit; used {MAX_RUN_TIMEOUT_S}. Use job_start.)\n"
        timeout_s = MAX_RUN_TIMEOUT_S
    if not code.strip():
        raise ToolError("code is empty; pass the Python program to run")
    fs = FsRoot(ctx.workspace.root)
    await asyncio.to_thread(fs.write, RUN_FILE, code.encode("utf-8"), parents=True)
    changes = ProgramChanges(ctx, "run_python")
    await asyncio.to_thread(changes.before)
    try:
        result = await run_program(ctx, ["python3", RUN_FILE], timeout_s=timeout_s,
                                   env={"PYTHONPATH": workspace_in_sandbox(ctx)})
    finally:
        journaled = await asyncio.to_thread(changes.after)
    return note + _report(result, timeout_s, journaled)


def _report(result: ProcessResult, timeout_s: int, journaled: str) -> str:
    if result.timed_out:
        head = (f"TIMED OUT: the program was still running after {timeout_s} s and was killed. "
                f"Output up to then:")
    elif result.killed:
        signal = result.returncode - 128
        why = {9: "SIGKILL", 24: "SIGXCPU: the CPU-time limit", 25: "SIGXFSZ: the file-size limit"}
        head = (f"KILLED by signal {signal} ({why.get(signal, 'a limit or a crash')}), exit code "
                f"{result.returncode}, after {result.duration_s:.1f} s")
    else:
        head = f"exit code {result.returncode} ({result.duration_s:.1f} s)"
    parts = [head]
    if not result.sandboxed:
        parts.append("(ran WITHOUT a sandbox: the admin allowed unsandboxed mode)")
    parts.append("--- stdout ---\n" + (clip(result.stdout, STDOUT_CHARS).rstrip("\n") or "(empty)"))
    if result.stderr:
        parts.append("--- stderr ---\n" + clip(result.stderr, STDERR_CHARS).rstrip("\n"))
    if result.truncated:
        parts.append("(the output was longer than the sandbox keeps; the middle was dropped)")
    if journaled:
        parts.append(journaled)
    return "\n".join(parts)


# --- background jobs ---


@tool
async def job_start(ctx: ToolContext, code: str, timeout_s: int = 600) -> str:
    """Start Python code as a background job in your sandboxed workspace and return its id at
    once; check on it with job_poll. Output goes to jobs/<id>/stdout.txt and stderr.txt as it
    is printed. Files a job changes are NOT journaled: undo cannot revert them.

    Args:
        code: The Python program to run (saved as jobs/<id>/main.py).
        timeout_s: Seconds before the job is killed, 1 to 21600 (6 hours).
    """
    if not 1 <= timeout_s <= MAX_JOB_TIMEOUT_S:
        raise ToolError(f"timeout_s must be between 1 and {MAX_JOB_TIMEOUT_S}, got {timeout_s}")
    if not code.strip():
        raise ToolError("code is empty; pass the Python program to run")
    refuse_when_full(ctx)
    record = job_runner(ctx).start(code, timeout_s)
    folder = record["folder"]
    return (f"started job {record['id']} (timeout {timeout_s} s); code in {folder}/main.py, output "
            f"in {folder}/stdout.txt and stderr.txt. job_poll(job_id={record['id']!r}) shows its "
            f"state and latest output.")


@tool
async def job_poll(ctx: ToolContext, job_id: str, tail_lines: int = 40) -> str:
    """Show a background job's state (running, done, failed, timed_out, stopped or lost), its
    exit code and the last lines of its output.

    Args:
        job_id: The id job_start returned, e.g. j1.
        tail_lines: How many of the last output lines to show, 1 to 200.
    """
    if not 1 <= tail_lines <= MAX_TAIL_LINES:
        raise ToolError(f"tail_lines must be between 1 and {MAX_TAIL_LINES}, got {tail_lines}")
    runner = job_runner(ctx)
    record = runner.get(job_id)
    stdout = await asyncio.to_thread(runner.tail, record, "stdout.txt", tail_lines)
    stderr = await asyncio.to_thread(runner.tail, record, "stderr.txt", tail_lines)
    empty = "(empty so far)" if record["state"] == "running" else "(empty)"
    parts = [_status_line(record),
             f"--- stdout (last {tail_lines} lines of {record['folder']}/stdout.txt) ---\n"
             + (clip(stdout, STDOUT_CHARS) or empty)]
    if stderr:
        parts.append(f"--- stderr (last {tail_lines} lines) ---\n{clip(stderr, STDERR_CHARS)}")
    return "\n".join(parts)


@tool
async def job_stop(ctx: ToolContext, job_id: str) -> str:
    """Stop a running background job (its whole process tree is killed); its output stays.

    Args:
        job_id: The id job_start returned, e.g. j1.
    """
    runner = job_runner(ctx)
    before = runner.get(job_id)
    if before["state"] != "running":
        return f"job {job_id} is not running; {_status_line(before)}"
    record = await runner.stop(job_id)
    if record["state"] == "running":
        raise ToolError(f"job {job_id} belongs to another job runner and cannot be stopped here")
    return _status_line(record)


@tool
async def job_list(ctx: ToolContext) -> str:
    """List your background jobs, newest first, with their states."""
    records = job_runner(ctx).records()
    if not records:
        return "no background jobs yet; job_start starts one"
    return "\n".join(_status_line(r) for r in reversed(records))


def _status_line(record: dict[str, Any]) -> str:
    state = record["state"]
    seconds = (record["ended"] or time.time()) - record["started"]
    line = f"job {record['id']}: {state}"
    if state == "running":
        line += f" for {seconds:.1f} s (timeout {record['timeout_s']:g} s)"
    else:
        line += f" after {seconds:.1f} s"
        if record["exit_code"] is not None:
            line += f", exit code {record['exit_code']}"
    if record.get("note"):
        line += f" ({record['note']})"
    if state == "lost":
        line += f"; the output it wrote before is in {record['folder']}/"
    return line
