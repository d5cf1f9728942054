"""The process runner: results, timeouts, caps, and the refusal without bubblewrap."""

from __future__ import annotations

import asyncio
import os
import pwd
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sandbox import process
from sandbox.bwrap import SANDBOX_USER, setup_user
from sandbox.paths import Workspace
from sandbox.process import (
    Limits,
    Sandbox,
    SandboxUnavailable,
    _Capture,
    unsandboxed_warning,
)

FAST = Limits(timeout_s=10, cpu_s=5)


def leftovers(token: str, wait_s: float = 3.0) -> list[str]:
    """Processes whose command line holds ``token``, after up to ``wait_s`` for teardown."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    cmdline = Path(entry.path, "cmdline").read_bytes()
                except OSError:
                    continue
                if token.encode() in cmdline:
                    shown = cmdline.replace(b"\0", b" ")[:200]
                    found.append(f"{entry.name}: {shown!r}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.fixture
def sandbox() -> Sandbox:
    box = Sandbox(limits=FAST)
    if not box.sandboxed:
        pytest.fail("bubblewrap 0.8+ is missing, so the sandbox cannot be tested. Fix: "
                    "apt-get install bubblewrap (CI does this in .ci/run).", pytrace=False)
    return box


@pytest.fixture
def ws(tmp_path) -> Workspace:
    return Workspace(tmp_path / "ws")


def py(code: str, *args: str) -> list[str]:
    return ["python3", "-c", code, *args]


async def test_a_successful_command_reports_ok_with_its_output(sandbox, ws):
    result = await sandbox.run(py("import os; print('hello', os.getcwd())"), ws)
    assert result.ok and result.returncode == 0 and result.sandboxed
    assert result.stdout == "hello /workspace\n"
    assert result.stderr == ""
    assert not (result.timed_out or result.killed or result.truncated)
    assert 0 < result.duration_s < 10


async def test_a_failing_command_reports_its_exit_status_and_stderr(sandbox, ws):
    result = await sandbox.run(py("import sys; print('bad', file=sys.stderr); sys.exit(3)"), ws)
    assert not result.ok
    assert result.returncode == 3 and result.stderr == "bad\n"
    assert not result.killed and not result.timed_out


async def test_a_command_killed_by_a_signal_reports_128_plus_the_signal(sandbox, ws):
    result = await sandbox.run(["sh", "-c", "kill -9 $$"], ws)
    assert result.returncode == 137 and result.killed and not result.timed_out


async def test_a_missing_program_is_a_failed_result_not_an_exception(sandbox, ws):
    result = await sandbox.run(["no-such-program-here"], ws)
    assert not result.ok and "no-such-program-here" in result.stderr


async def test_stdin_reaches_the_program(sandbox, ws):
    result = await sandbox.run(py("import sys; print(sys.stdin.read().upper())"), ws,
                               stdin="over the wall")
    assert result.stdout == "OVER THE WALL\n"


async def test_a_program_that_ignores_a_large_stdin_still_finishes(sandbox, ws):
    result = await sandbox.run(py("print('ignored')"), ws, stdin="x" * (4 << 20))
    assert result.ok and result.stdout == "ignored\n"


async def test_the_environment_is_minimal_plus_what_the_caller_passes(sandbox, ws):
    result = await sandbox.run(py("import os, json; print(json.dumps(dict(os.environ)))"), ws,
                               env={"GIT_AUTHOR_NAME": "agent"})
    env = eval(result.stdout)  # json is valid Python here
    assert env["HOME"] == "/workspace" and env["LANG"] == "C.UTF-8"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["GIT_AUTHOR_NAME"] == "agent"
    assert set(env) <= {"PATH", "HOME", "LANG", "TMPDIR", "PYTHONDONTWRITEBYTECODE",
                        "GIT_AUTHOR_NAME", "PWD"}


async def test_python3_inside_is_the_bots_interpreter_version(sandbox, ws):
    result = await sandbox.run(py("import sys; print(sys.version_info[:2])"), ws)
    assert result.stdout.strip() == str(tuple(sys.version_info[:2]))


async def test_files_written_inside_land_in_the_workspace_as_a_non_root_user(sandbox, ws):
    (ws.root / "from_bot.txt").write_text("bot wrote this")
    code = ("open('out.txt', 'w').write('made inside');"
            "open('from_bot.txt', 'a').write(' and the agent changed it')")
    result = await sandbox.run(py(code), ws)
    assert result.ok, result.stderr
    assert (ws.root / "out.txt").read_text() == "made inside"
    assert (ws.root / "from_bot.txt").read_text() == "bot wrote this and the agent changed it"
    owner = (ws.root / "out.txt").stat().st_uid
    assert owner != 0
    if os.geteuid() == 0:
        assert owner == pwd.getpwnam(SANDBOX_USER).pw_uid
    else:
        assert owner == os.getuid()


def test_setup_user_is_idempotent_and_unprivileged():
    if os.geteuid() != 0:
        # Not root: the sandbox runs as the bot's own, non-root user instead.
        assert os.getuid() != 0
        return
    first, second = setup_user(), setup_user()
    assert first == second and first[0] != 0 and first[1] != 0
    entry = pwd.getpwnam(SANDBOX_USER)
    assert entry.pw_shell.endswith("nologin")
    assert not Path(entry.pw_dir).exists() or entry.pw_dir in ("/", "/nonexistent")


async def test_a_timeout_kills_the_whole_group_and_leaves_nothing(sandbox, ws):
    token = uuid.uuid4().hex
    sleeper = f"import time; time.sleep(300)  # {token}"
    code = (f"import subprocess, os, time\n"
            f"subprocess.Popen(['python3', '-c', {sleeper!r}])\n"
            f"subprocess.Popen(['setsid', 'python3', '-c', {sleeper!r}])\n"
            f"if os.fork() == 0:\n    os.setsid(); time.sleep(300)\n"
            f"print('started', flush=True); time.sleep(300)\n")
    started = time.monotonic()
    result = await sandbox.run(py(code, token), ws, timeout_s=1.5)
    assert result.timed_out and result.killed and not result.ok
    assert result.stdout == "started\n"  # output before the kill is kept
    assert time.monotonic() - started < 6
    assert leftovers(token) == []


async def test_background_children_die_when_the_program_ends(sandbox, ws):
    token = uuid.uuid4().hex
    code = ("import subprocess, sys\n"
            "subprocess.Popen(['setsid', 'python3', '-c', 'import time; time.sleep(300)',"
            " sys.argv[1]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print('left a child behind')")
    started = time.monotonic()
    result = await sandbox.run(py(code, token), ws, timeout_s=20)
    assert result.ok and not result.timed_out
    assert time.monotonic() - started < 5
    assert leftovers(token) == []


async def test_cancelling_a_run_kills_the_program(sandbox, ws):
    token = uuid.uuid4().hex
    task = asyncio.create_task(sandbox.run(py("import time; time.sleep(300)", token), ws))
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert leftovers(token) == []


async def test_output_past_the_cap_is_cut_keeping_head_and_tail(ws, sandbox):
    box = Sandbox(limits=Limits(output_bytes=64 * 1024, timeout_s=10))
    code = "import sys; sys.stdout.write('A' + 'x' * (3 << 20) + 'Z'); sys.stderr.write('e' * 10)"
    result = await box.run(py(code), ws)
    assert result.ok and result.truncated and not result.killed
    assert result.stdout.startswith("A") and result.stdout.endswith("Z")
    assert "bytes omitted" in result.stdout
    assert len(result.stdout) < 64 * 1024 + 100
    assert result.stderr == "e" * 10


def test_capture_keeps_head_and_tail_exactly():
    capture = _Capture(10)
    for chunk in (b"01234", b"56789", b"abcde", b"fghij"):
        capture.feed(chunk)
    assert capture.truncated
    assert capture.decode() == "01234\n[... 10 bytes omitted ...]\nfghij"
    small = _Capture(10)
    small.feed(b"0123456789")
    assert not small.truncated and small.decode() == "0123456789"


async def test_two_channels_run_at_once_in_their_own_workspaces(sandbox, tmp_path):
    a, b = Workspace(tmp_path / "a"), Workspace(tmp_path / "b")
    code = "import os, time; time.sleep(0.3); print(sorted(os.listdir('.')))"
    (a.root / "only_a.txt").write_text("a")
    ra, rb = await asyncio.gather(sandbox.run(py(code), a), sandbox.run(py(code), b))
    assert ra.ok and rb.ok
    assert "only_a.txt" in ra.stdout and "only_a.txt" not in rb.stdout


# --- without bubblewrap ---


@pytest.fixture
def no_bwrap(monkeypatch):
    monkeypatch.setattr(process, "find_bwrap", lambda: None)


async def test_without_bwrap_running_code_is_refused_with_the_fix(no_bwrap, ws):
    box = Sandbox()
    assert not box.sandboxed
    with pytest.raises(SandboxUnavailable) as refusal:
        await box.run(py("print(1)"), ws)
    message = str(refusal.value)
    assert "apt-get install bubblewrap" in message
    assert "sandbox.allow_unsandboxed = true" in message


async def test_allowed_unsandboxed_mode_runs_with_limits_in_the_workspace(no_bwrap, ws,
                                                                         monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_TEST_SECRET", "do-not-leak")
    box = Sandbox(allow_unsandboxed=True, limits=Limits(timeout_s=10, address_space_mb=512))
    code = ("import os\nprint(os.getcwd()); print(os.environ.get('NIGHTSHIFT_TEST_SECRET'))\n"
            "try:\n    bytearray(1 << 30)\nexcept MemoryError:\n    print('capped')")
    result = await box.run(py(code), ws)
    assert result.ok and not result.sandboxed
    assert result.stdout.split() == [str(ws.root), "None", "capped"]
    timed = await box.run(py("import time; time.sleep(60)"), ws, timeout_s=0.5)
    assert timed.timed_out and timed.killed and not timed.sandboxed


async def test_unsandboxed_mode_reports_a_missing_program_as_a_result(no_bwrap, ws):
    result = await Sandbox(allow_unsandboxed=True).run(["no-such-program-here"], ws)
    assert not result.ok and result.returncode == 127 and "no-such-program-here" in result.stderr


def test_the_start_warning_matches_the_mode(monkeypatch):
    assert unsandboxed_warning(False) is None and unsandboxed_warning(True) is None
    monkeypatch.setattr(process, "find_bwrap", lambda: None)
    assert "WITHOUT a sandbox" in unsandboxed_warning(True)
    assert "refuse" in unsandboxed_warning(False)
    assert "WITHOUT a sandbox" in process.warning()


# --- the debug entry point ---


def test_the_cli_runs_a_command_as_the_tools_do_and_exits_with_its_code(tmp_path, sandbox):
    repo = Path(__file__).parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "sandbox", "run", "--workspace", str(tmp_path / "cli"), "--",
         "python3", "-c", "import os; print(os.getcwd()); raise SystemExit(5)"],
        capture_output=True, text=True, cwd=repo, timeout=60, check=False,
    )
    assert done.returncode == 5, done.stderr
    assert "sandboxed: True" in done.stdout
    assert "returncode: 5" in done.stdout
    assert "/workspace" in done.stdout
