"""tools.worker: the child process that parses untrusted bytes, its limits and its answers."""

from __future__ import annotations

import os
import signal

import pytest

from tools import ToolError, worker

LIMITS = worker.Limits(memory_mb=512, cpu_s=5, timeout_s=20)


def test_the_child_sees_nothing_of_the_bot_and_runs_under_its_limits(monkeypatch, tmp_path):
    monkeypatch.setenv("DISCORD_TOKEN", "not-for-the-child")
    leaked = os.open(tmp_path, os.O_RDONLY)  # a descriptor of the bot's that must not pass on
    try:
        seen = worker.run("probe", {}, b"x" * 1000, what="probing", limits=LIMITS)
    finally:
        os.close(leaked)
    # Started with an empty environment: only what bwrap (PWD) and Python's locale
    # coercion (LC_CTYPE) set themselves.
    assert set(seen["env"]) <= {"PWD", "LC_CTYPE"}
    assert seen["limits"] == {"RLIMIT_AS": 512 << 20, "RLIMIT_CPU": 5, "RLIMIT_FSIZE": 0,
                              "RLIMIT_CORE": 0, "RLIMIT_NPROC": 0}
    assert seen["cwd"] == "/" and "" not in seen["sys_path"] and "/" not in seen["sys_path"]
    assert seen["sys_path"][0] == "/parse"  # the sealed folder, which holds parsers.py only
    assert not any(p.endswith("/tools") or "site-packages" in p for p in seen["sys_path"])
    assert not seen["tools_imported"]  # the child never imports the bot's tools package
    assert leaked not in seen["fds"] and len(seen["fds"]) <= 4  # 0, 1, 2 and the listing's own
    assert seen["bytes"] == 1000


def test_an_inherited_descriptor_is_passed_under_its_number(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        seen = worker.run("probe", {}, what="probing", limits=LIMITS, fds=(fd,))
    finally:
        os.close(fd)
    assert fd in seen["fds"]


def test_a_refusal_in_the_child_is_a_tool_error_with_its_message():
    with pytest.raises(ToolError, match="invalid regular expression"):
        worker.run("grep", {"pattern": "(", "path": ".", "glob": "*", "fd": 0, "folder": False,
                            "base": "x"}, what="grep", limits=LIMITS)


def test_an_unknown_task_is_a_bug_of_the_caller():
    with pytest.raises(KeyError):
        worker.run("shell", {}, what="nothing")


@pytest.mark.parametrize("returncode,expected", [
    (-signal.SIGXCPU, "used more than 5 s of CPU time"),
    (-signal.SIGKILL, "used more than 5 s of CPU time"),
    (-signal.SIGSEGV, "the parser crashed on this input (signal SIGSEGV"),
    (3, "the parser crashed on this input (exit code 3"),
])
def test_how_the_child_ended_becomes_a_clear_error(returncode, expected):
    with pytest.raises(ToolError) as caught:
        worker._result(returncode, b"", b"Fatal Python error\n", "reading a.pdf", "", LIMITS)
    assert str(caught.value).startswith("reading a.pdf") and expected in str(caught.value)


def test_running_out_of_memory_and_a_bug_are_told_apart():
    with pytest.raises(ToolError, match="needed more than 512 MiB"):
        worker._result(0, b'{"memory": true}', b"", "outlining a.py", "", LIMITS)
    with pytest.raises(ToolError, match="needed more than 512 MiB"):
        worker._result(1, b"", b"Traceback ...\nMemoryError\n", "outlining a.py", "", LIMITS)
    with pytest.raises(RuntimeError, match="KeyError"):
        worker._result(0, b'{"bug": "KeyError: x"}', b"", "outlining a.py", "", LIMITS)
