"""The parse worker's jail: what code run by an exploited parser could reach, one test each.

The ``probe`` task stands in for such code: it reads the paths it is given, as an exploit in
pypdf's or Pillow's C code could, from inside the same sealed child (tools.worker).
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from sandbox.bwrap import SANDBOX_USER
from sandbox.paths import Workspace
from sandbox.process import Sandbox
from tests.hostile_files import CATASTROPHIC_PATTERN, catastrophic_line
from tests.test_tools_media import png, text_pdf
from tools import ToolContext, ToolError, default_registry, worker

ROOT = Path(__file__).resolve().parents[1]
LIMITS = worker.Limits(memory_mb=512, cpu_s=5, timeout_s=20)
REGISTRY = default_registry()


def processes_with(text: bytes) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and text in Path(entry.path, "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def probe(*paths: str, task: str = "probe") -> dict:
    return worker.run(task, {"read": list(paths)}, what="probing", limits=LIMITS)


def test_a_task_runs_as_an_unprivileged_user():
    seen = probe()
    assert seen["uid"] != 0 and seen["gid"] != 0
    if os.geteuid() == 0:  # the sandbox's own user, not root and not the bot's
        assert seen["uid"] == pwd.getpwnam(SANDBOX_USER).pw_uid


def test_a_task_cannot_read_the_bots_environment_through_proc(monkeypatch):
    token = f"token-{uuid.uuid4().hex}"
    monkeypatch.setenv("DISCORD_TOKEN", token)  # what the child would inherit
    # /proc/PID/environ shows a process's initial environment: a process started with the
    # token stands in for the bot (whose own setenv above would not show there).
    bot = subprocess.Popen(["sleep", "60"], env={"DISCORD_TOKEN": token})
    try:
        first = probe()
        # Its own PID namespace: bwrap, at most a second bwrap, and itself.
        assert len(first["pids"]) <= 3
        paths = [f"/proc/{pid}/{part}" for pid in {*first["pids"], bot.pid, os.getpid()}
                 for part in ("environ", "cmdline")]
        seen = probe(*paths, "/proc/self/environ")
        allowed = Sandbox(allow_unsandboxed=True)
        allowed.bwrap = None
        control = worker.run("probe", {"read": paths}, what="probing", limits=LIMITS, box=allowed)
    finally:
        bot.kill()
        bot.wait()
    assert token not in json.dumps(seen)
    assert seen["read"][f"/proc/{bot.pid}/environ"].startswith("FileNotFoundError")
    assert token in control["read"][f"/proc/{bot.pid}/environ"]  # unsandboxed, it could


def test_a_task_sees_none_of_the_bots_files(tmp_path):
    token = uuid.uuid4().hex
    data_dir = tmp_path / "data"  # the bot's data dir, as the runtime lays it out
    (data_dir / "workspaces" / "general").mkdir(parents=True)
    planted = [data_dir / "secret.txt", data_dir / "workspaces" / "general" / "notes.txt",
               ROOT / f".jail-probe-{token}"]
    for path in planted:
        path.write_text(f"secret-{token}")
    try:
        seen = probe(*map(str, planted), str(ROOT / "tools" / "parsers.py"),
                     str(ROOT / "README.md"), str(ROOT / ".venv" / "pyvenv.cfg"), "/root/.bashrc",
                     "/etc/passwd", "/etc/shadow", str(tmp_path), task="probe_packages")
    finally:
        planted[-1].unlink()
    assert f"secret-{token}" not in json.dumps(seen)
    assert all(r.startswith("FileNotFoundError") for r in seen["read"].values()), seen["read"]


def test_a_task_sees_only_the_parse_packages_beside_parsers_py():
    inside = ["/parse/parsers.py", "/parse/PIL/__init__.py", "/parse/pypdf/__init__.py"]
    full = probe(*inside, task="probe_packages")  # the pdf and image tasks' jail
    assert full["read"]["/parse/parsers.py"].startswith('"""The work ``tools.worker`` runs')
    assert not any(r.startswith("FileNotFoundError") for r in full["read"].values())
    stdlib_only = probe(*inside)  # grep, outline and probe get no packages
    assert [r.split(":")[0] for r in stdlib_only["read"].values()][1:] == ["FileNotFoundError"] * 2


def test_a_task_has_no_network():
    seen = probe("/proc/self/net/dev")
    interfaces = [line.split(":")[0].strip() for line in seen["read"]["/proc/self/net/dev"]
                  .splitlines()[2:]]
    assert interfaces == ["lo"]


@pytest.fixture
def ctx(tmp_path):
    return ToolContext.open("jail", Workspace(tmp_path / "ws"), tmp_path / "state",
                            image_cache=str(tmp_path / "images"))


async def test_grep_outline_pdf_and_image_still_work_on_real_files(ctx):
    root = ctx.workspace.root  # 0700 and the bot's: grep's walk needs the hand-over as root
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("class App:\n    def run(self):\n        pass  # TODO\n")
    (root / "doc.pdf").write_bytes(text_pdf(["first page", "second page"]))
    (root / "pic.png").write_bytes(png(size=(40, 20)))
    found = await REGISTRY.call("grep", {"pattern": "TODO"}, ctx)
    assert found.ok and "src/app.py:3:" in found.output, found.output
    outlined = await REGISTRY.call("outline", {"path": "src/app.py"}, ctx)
    assert outlined.ok and "class App" in outlined.output and "def run(self)" in outlined.output
    pdf = await REGISTRY.call("read_pdf", {"path": "doc.pdf"}, ctx)
    assert pdf.ok and "first page" in pdf.output and "second page" in pdf.output, pdf.output
    image = await REGISTRY.call("view_image", {"path": "pic.png"}, ctx)
    assert image.ok and "40x20" in image.output.replace(" ", ""), image.output


def test_without_bubblewrap_the_worker_refuses_unless_unsandboxed_runs_are_allowed(
        monkeypatch, caplog):
    monkeypatch.setattr(worker, "find_bwrap", lambda: None)
    with pytest.raises(ToolError, match="parsed only in the sandbox.*bubblewrap"):
        probe()
    strict = Sandbox()
    strict.bwrap = None
    with pytest.raises(ToolError, match="bubblewrap"):
        worker.run("probe", {}, what="probing", limits=LIMITS, box=strict)
    allowed = Sandbox(allow_unsandboxed=True)
    allowed.bwrap = None
    with caplog.at_level(logging.WARNING, logger="nightshift.tools.worker"):
        seen = worker.run("probe", {}, what="probing", limits=LIMITS, box=allowed)
    assert seen["uid"] == os.getuid()  # as before the sandbox: the bot's user...
    assert "WITHOUT a sandbox" in caplog.text  # ...and said so, every call


def test_a_task_stopped_by_the_timeout_leaves_nothing_running(tmp_path):
    # As root the namespace's PID 1 does not die with bwrap: the worker must kill it itself.
    target = tmp_path / "a.txt"
    target.write_text(catastrophic_line(40))
    fd = os.open(target, os.O_RDONLY)
    start = time.monotonic()
    try:
        with pytest.raises(ToolError, match="took longer than 2 s"):
            worker.run("grep", {"pattern": CATASTROPHIC_PATTERN, "path": "a.txt", "glob": "*",
                                "fd": fd, "folder": False, "base": "a.txt"}, fds=(fd,),
                       what="grep", limits=worker.Limits(memory_mb=512, cpu_s=117, timeout_s=2))
    finally:
        os.close(fd)
    assert time.monotonic() - start < 10
    time.sleep(0.5)
    assert not processes_with(b"parsers.py\0grep\0512\0117\0")  # this run's child
