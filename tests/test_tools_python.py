"""run_python and the background jobs, called through the registry as the agent calls them."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from sandbox.paths import Workspace
from sandbox.process import Sandbox
from tools import ToolContext, default_registry, programs
from tools.jobs import JobRunner
from tools.python_jobs import job_runner

REGISTRY = default_registry()
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
async def ctx(tmp_path: Path):
    if not Sandbox().sandboxed:
        pytest.fail("bubblewrap 0.8+ is missing, so sandboxed Python cannot be tested. Fix: "
                    "apt-get install bubblewrap.", pytrace=False)
    context = ToolContext.open("test", Workspace(tmp_path / "ws"), tmp_path / "state")
    yield context
    runner = context.services.jobs_runner
    if runner is not None:
        await runner.close()


async def call(ctx: ToolContext, name: str, /, **arguments):
    return await REGISTRY.call(name, arguments, ctx)


async def ok(ctx: ToolContext, name: str, /, **arguments) -> str:
    result = await call(ctx, name, **arguments)
    assert result.ok, result.output
    return result.output


def ws_file(ctx: ToolContext, path: str) -> Path:
    return ctx.workspace.root / path


async def wait_for(predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


def processes_mentioning(token: str) -> list[str]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline:
                found.append(cmdline.replace(b"\0", b" ")[:200].decode(errors="replace"))
    return found


# --- run_python ---


async def test_run_python_prints_output_and_keeps_the_code_in_scratch(ctx):
    out = await ok(ctx, "run_python", code="import os\nprint('hello', os.getcwd())")
    assert out.startswith("exit code 0")
    assert "hello /workspace" in out
    assert ws_file(ctx, "scratch/run_python.py").read_text().startswith("import os")


async def test_run_python_reports_a_non_zero_exit_with_stderr(ctx):
    out = await ok(ctx, "run_python", code="import sys\nprint('bad', file=sys.stderr)\nsys.exit(3)")
    assert out.startswith("exit code 3")
    assert "--- stderr ---\nbad" in out


async def test_run_python_reports_a_timeout_with_the_output_so_far(ctx):
    out = await ok(ctx, "run_python", code="import time\nprint('first', flush=True)\ntime.sleep(30)",
                   timeout_s=1)
    assert out.startswith("TIMED OUT") and "after 1 s" in out
    assert "first" in out


async def test_run_python_refuses_a_zero_timeout_and_caps_a_long_one(ctx):
    assert not (await call(ctx, "run_python", code="print(1)", timeout_s=0)).ok
    out = await ok(ctx, "run_python", code="print(1)", timeout_s=9999)
    assert "used 300" in out


async def test_run_python_imports_the_agents_own_modules_from_the_workspace(ctx):
    ws_file(ctx, "helper.py").write_text("VALUE = 42\n")
    out = await ok(ctx, "run_python", code="import helper\nprint(helper.VALUE)")
    assert "42" in out


async def test_run_python_file_changes_are_undone_by_undo(ctx):
    ws_file(ctx, "keep.txt").write_text("old")
    out = await ok(ctx, "run_python", code=(
        "import os\nos.makedirs('made/deep')\nopen('made/deep/f.txt', 'w').write('x')\n"
        "open('keep.txt', 'w').write('new')\nos.remove('scratch/run_python.py')"))
    assert "journaled" in out and "created made/" in out
    assert ws_file(ctx, "keep.txt").read_text() == "new"
    await ok(ctx, "undo")
    assert not ws_file(ctx, "made").exists()
    assert ws_file(ctx, "keep.txt").read_text() == "old"
    assert ws_file(ctx, "scratch/run_python.py").exists()
    await ok(ctx, "redo")
    assert ws_file(ctx, "made/deep/f.txt").read_text() == "x"


async def test_run_python_sees_a_same_size_rewrite_of_a_file(ctx):
    await ok(ctx, "write_file", path="a.txt", content="aaaa")
    await ok(ctx, "run_python", code="print('warm the index')")
    out = await ok(ctx, "run_python", code="open('a.txt', 'r+').write('bbbb')")
    assert "changed a.txt" in out
    await ok(ctx, "undo")
    assert ws_file(ctx, "a.txt").read_text() == "aaaa"
    await ok(ctx, "undo")  # then the write_file before it, cleanly
    assert not ws_file(ctx, "a.txt").exists()


async def test_run_python_in_a_too_large_workspace_runs_unjournaled_and_undo_still_refuses(ctx, monkeypatch):
    monkeypatch.setattr(programs, "MAX_TRACKED_FILES", 3)
    await ok(ctx, "write_file", path="a.txt", content="mine")
    for name in ("b", "c", "d"):
        ws_file(ctx, name).write_text(name)
    out = await ok(ctx, "run_python", code="open('a.txt', 'w').write('theirs')")
    assert "not journaled" in out
    refused = await call(ctx, "undo")
    assert not refused.ok and "changed outside the journal" in refused.output
    assert ws_file(ctx, "a.txt").read_text() == "theirs"


async def test_run_python_cannot_read_shadow_or_the_host_repository(ctx):
    code = (f"import os\nprint(os.path.exists('/etc/shadow'), os.path.exists({str(REPO)!r}), "
            f"os.path.exists({str(REPO / 'pyproject.toml')!r}))")
    out = await ok(ctx, "run_python", code=code)
    assert "False False False" in out


async def test_python_tools_refuse_with_the_fix_when_bubblewrap_is_missing(ctx):
    box = Sandbox()
    box.bwrap = None  # as on a machine without bubblewrap, unsandboxed mode not allowed
    ctx.services.sandbox = box
    for name, arguments in (("run_python", {"code": "print(1)"}), ("job_start", {"code": "print(1)"})):
        result = await call(ctx, name, **arguments)
        assert not result.ok
        assert "bubblewrap" in result.output and "allow_unsandboxed" in result.output


# --- background jobs ---


async def test_a_job_runs_in_the_background_and_ends_done_with_its_output(ctx):
    out = await ok(ctx, "job_start", code=(
        "import time\nprint('tick', flush=True)\nwhile not __import__('os').path.exists('go'):\n"
        "    time.sleep(0.05)\nprint('finished')"))
    assert "started job j1" in out
    await wait_for(lambda: "tick" in ws_file(ctx, "jobs/j1/stdout.txt").read_text())
    running = await ok(ctx, "job_poll", job_id="j1")
    assert running.startswith("job j1: running") and "tick" in running
    ws_file(ctx, "go").write_text("")
    await wait_for(lambda: job_runner(ctx).get("j1")["state"] != "running")
    done = await ok(ctx, "job_poll", job_id="j1", tail_lines=1)
    assert done.startswith("job j1: done") and "exit code 0" in done
    assert "finished" in done and "tick" not in done  # tail_lines=1


async def test_a_failing_job_is_reported_failed_with_its_stderr(ctx):
    await ok(ctx, "job_start", code="raise SystemExit('broken')")
    await wait_for(lambda: job_runner(ctx).get("j1")["state"] != "running")
    out = await ok(ctx, "job_poll", job_id="j1")
    assert out.startswith("job j1: failed") and "exit code 1" in out and "broken" in out


async def test_a_job_past_its_timeout_is_reported_timed_out(ctx):
    await ok(ctx, "job_start", code="import time\ntime.sleep(30)", timeout_s=1)
    await wait_for(lambda: job_runner(ctx).get("j1")["state"] != "running")
    assert (await ok(ctx, "job_poll", job_id="j1")).startswith("job j1: timed_out")


async def test_job_stop_kills_the_job_and_its_processes(ctx):
    await ok(ctx, "job_start", code="import subprocess, time\nsubprocess.Popen(['sleep', '60'])\n"
                                    "print('up', flush=True)\ntime.sleep(60)")
    await wait_for(lambda: "up" in ws_file(ctx, "jobs/j1/stdout.txt").read_text())
    out = await ok(ctx, "job_stop", job_id="j1")
    assert out.startswith("job j1: stopped")
    await wait_for(lambda: not processes_mentioning(str(ctx.workspace.root)), timeout_s=5)
    assert "not running" in await ok(ctx, "job_stop", job_id="j1")


async def test_job_list_shows_every_job_newest_first_and_poll_refuses_unknown_ids(ctx):
    assert "no background jobs" in await ok(ctx, "job_list")
    await ok(ctx, "job_start", code="print(1)")
    await ok(ctx, "job_start", code="print(2)")
    lines = (await ok(ctx, "job_list")).splitlines()
    assert lines[0].startswith("job j2") and lines[1].startswith("job j1")
    unknown = await call(ctx, "job_poll", job_id="j9")
    assert not unknown.ok and "j1, j2" in unknown.output


async def test_a_job_cut_off_by_a_restart_is_reported_lost_with_its_output(ctx, tmp_path):
    await ok(ctx, "job_start", code="import time\nprint('partial', flush=True)\ntime.sleep(60)")
    await wait_for(lambda: "partial" in ws_file(ctx, "jobs/j1/stdout.txt").read_text())
    # The bot restarts: a new context and runner over the same state_dir, none of the old processes.
    after = ToolContext.open("test", Workspace(tmp_path / "ws"), tmp_path / "state")
    out = await ok(after, "job_poll", job_id="j1")
    assert out.startswith("job j1: lost") and "restarted" in out and "partial" in out
    await ctx.services.jobs_runner.close()  # the old runner's late end must not overwrite it
    assert job_runner(after).get("j1")["state"] == "lost"
    assert "restarted" in job_runner(after).get("j1")["note"]
    await job_runner(after).close()


async def test_closing_the_runner_kills_its_jobs_and_marks_them_lost(ctx):
    await ok(ctx, "job_start", code="import time\nprint('on', flush=True)\ntime.sleep(60)")
    await wait_for(lambda: "on" in ws_file(ctx, "jobs/j1/stdout.txt").read_text())
    runner = ctx.services.jobs_runner
    await runner.close()
    record = runner.get("j1")
    assert record["state"] == "lost" and "shut down" in record["note"]
    await wait_for(lambda: not processes_mentioning(str(ctx.workspace.root)), timeout_s=5)


async def test_job_records_persist_in_state_dir_and_feed_the_health_summary(ctx):
    await ok(ctx, "job_start", code="print(1)")
    await wait_for(lambda: job_runner(ctx).get("j1")["state"] != "running")
    saved = json.loads((ctx.state_dir / "jobs.json").read_text())
    assert saved["jobs"]["j1"]["state"] == "done" and saved["next_id"] == 2
    assert ctx.services.jobs()[0]["id"] == "j1" and ctx.services.jobs()[0]["state"] == "done"
    assert "id=j1, state=done" in await ok(ctx, "health")


async def test_a_job_folder_swapped_for_a_link_out_is_not_followed(ctx, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    await ok(ctx, "job_start", code="print('x')")
    await wait_for(lambda: job_runner(ctx).get("j1")["state"] != "running")
    os.remove(ws_file(ctx, "jobs/j1/stdout.txt"))
    os.symlink(secret, ws_file(ctx, "jobs/j1/stdout.txt"))
    out = await ok(ctx, "job_poll", job_id="j1")
    assert "host secret" not in out and "cannot be read" in out


def test_a_new_runner_only_marks_running_jobs_lost(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    jobs = {"j1": {"id": "j1", "state": "done", "started": 1.0, "ended": 2.0, "timeout_s": 5,
                   "exit_code": 0, "note": "", "folder": "jobs/j1", "owner": "old"},
            "j2": {"id": "j2", "state": "running", "started": 1.0, "ended": None, "timeout_s": 5,
                   "exit_code": None, "note": "", "folder": "jobs/j2", "owner": "old"}}
    (state / "jobs.json").write_text(json.dumps({"version": 1, "next_id": 3, "jobs": jobs}))
    runner = JobRunner(Workspace(tmp_path / "ws"), state, Sandbox())
    assert runner.get("j1")["state"] == "done"
    assert runner.get("j2")["state"] == "lost"
