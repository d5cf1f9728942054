"""Adversarial probes: one per sandbox property, each a real program trying to get out.

Every probe runs in the real sandbox and prints a verdict ({"escaped": ...}).
For each one: the verdict says no escape, the host side confirms it, the
positive control (the probe writes control.txt in its workspace first) landed
on the host, and no process of the probe is left afterwards.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox.bwrap import interpreter_prefix
from sandbox.paths import PathEscape, Workspace
from sandbox.process import Limits, ProcessResult, Sandbox

REPO = Path(__file__).resolve().parents[1]
PROBE_LIMITS = Limits(timeout_s=15, cpu_s=10)

PRELUDE = """\
import json, os, sys
TOKEN = sys.argv[1]
ARGS = json.loads(sys.argv[2])
with open("control.txt", "w") as control:  # the positive control: inside is writable
    control.write(TOKEN)

def verdict(escaped, **detail):
    print(json.dumps({"escaped": bool(escaped), **detail}), flush=True)

def attempt(fn, *args):
    try:
        return True, repr(fn(*args))[:200]
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"[:200]
"""


@dataclass
class Probe:
    result: ProcessResult
    verdict: dict | None
    token: str


class Lab:
    """A workspace, a host folder outside it with a secret, and a way to run probes."""

    def __init__(self, tmp_path: Path) -> None:
        self.ws = Workspace(tmp_path / "ws")
        self.outside = tmp_path / "outside"
        self.outside.mkdir()
        self.secret_token = f"host-secret-{uuid.uuid4().hex}"
        self.secret = self.outside / "secret.txt"
        self.secret.write_text(self.secret_token)

    def run(self, code: str, *, limits: Limits = PROBE_LIMITS, expect_verdict: bool = True,
            **args) -> Probe:
        token = uuid.uuid4().hex
        box = Sandbox(limits=limits)
        if not box.sandboxed:
            pytest.fail("bubblewrap 0.8+ is missing: apt-get install bubblewrap", pytrace=False)
        argv = ["python3", "-c", PRELUDE + textwrap.dedent(code), token, json.dumps(args)]
        result = box.run_sync(argv, self.ws)
        assert result.sandboxed
        assert (self.ws.root / "control.txt").read_text() == token, result.stderr
        assert _leftovers(token) == []
        lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
        verdict = json.loads(lines[-1]) if lines else None
        if expect_verdict:
            assert verdict is not None, f"no verdict: {result}"
            assert verdict["escaped"] is False, verdict
        return Probe(result, verdict, token)


def _leftovers(token: str, wait_s: float = 3.0) -> list[str]:
    """Processes whose command line holds ``token`` (teardown may take a moment)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if token.encode() in Path(entry.path, "cmdline").read_bytes():
                        found.append(entry.name)
                except OSError:
                    continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.fixture
def lab(tmp_path) -> Lab:
    return Lab(tmp_path)


# --- file system ---


@pytest.mark.parametrize("target", ["/etc/nightshift-probe", "/root/nightshift-probe",
                                    "/work/nightshift-probe", "/usr/nightshift-probe",
                                    "/nightshift-probe", str(REPO / "nightshift-probe")])
def test_absolute_writes_outside_the_workspace_fail(lab, target):
    lab.run("""
        ok, detail = attempt(lambda: open(ARGS["target"], "w").write("escaped"))
        verdict(ok, detail=detail)
    """, target=target)
    assert not os.path.lexists(target)  # False too where the test may not look (not root)


def test_dotdot_leads_nowhere_on_the_host(lab, tmp_path):
    (tmp_path / "neighbour").mkdir()
    lab.run("""
        wrote = [attempt(lambda p=p: open(p, "w").write("x"))[0]
                 for p in ("../escaped.txt", "../../escaped.txt", "scratch/../../escaped.txt")]
        seen = os.listdir("..") + os.listdir("../..")
        verdict(any(wrote) or "neighbour" in seen or "outside" in seen, seen=sorted(set(seen)))
    """)
    assert not (tmp_path / "escaped.txt").exists()
    assert not (tmp_path.parent / "escaped.txt").exists()


def test_a_symlink_planted_by_the_host_cannot_reach_the_host_file(lab):
    os.symlink(lab.secret, lab.ws.root / "planted_abs")
    os.symlink(os.path.relpath(lab.secret, lab.ws.root), lab.ws.root / "planted_rel")
    before = lab.secret.stat()
    lab.run("""
        got = [attempt(lambda p=p: open(p).read()) for p in ("planted_abs", "planted_rel")]
        verdict(any(ARGS["secret"] in detail for _, detail in got), got=got)
    """, secret=lab.secret_token)
    after = lab.secret.stat()
    # Handing the workspace to the sandbox user changed the links, not their target.
    assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid,
                                                           before.st_mode)


def test_a_symlink_the_agent_makes_reaches_neither_the_host_nor_the_file_tools(lab):
    lab.run("""
        os.symlink(ARGS["secret_path"], "mine")
        os.symlink("/etc", "etc_link")
        ok, detail = attempt(lambda: open("mine").read())
        verdict(ARGS["secret"] in detail, detail=detail)
    """, secret_path=str(lab.secret), secret=lab.secret_token)
    # The host side: the file tools refuse to follow what the agent planted.
    for name in ("mine", "etc_link/passwd"):
        with pytest.raises(PathEscape):
            lab.ws.resolve(name)


def test_hard_links_to_host_files_cannot_be_made(lab):
    host_passwd = os.stat("/etc/passwd")
    lab.run("""
        made = {src: attempt(os.link, src, f"hl{i}") for i, src in
                enumerate((ARGS["secret_path"], "/etc/passwd", "/usr/bin/env"))}
        leaked = any(ARGS["secret"] in open(f"hl{i}", errors="replace").read()
                     for i in range(3) if os.path.exists(f"hl{i}"))
        verdict(leaked or made[ARGS["secret_path"]][0], made=made)
    """, secret_path=str(lab.secret), secret=lab.secret_token)
    assert lab.secret.stat().st_nlink == 1
    inodes = {(p.stat().st_dev, p.stat().st_ino) for p in lab.ws.root.iterdir() if p.is_file()}
    assert (host_passwd.st_dev, host_passwd.st_ino) not in inodes


def test_host_files_named_by_absolute_path_are_invisible(lab):
    lab.run("""
        got = attempt(lambda: open(ARGS["secret_path"]).read())
        listed = attempt(os.listdir, ARGS["outside"])
        verdict(got[0] or listed[0], got=got, listed=listed)
    """, secret_path=str(lab.secret), outside=str(lab.outside))


def test_etc_shadow_and_the_hosts_accounts_are_unreadable(lab):
    lab.run("""
        shadow = attempt(lambda: open("/etc/shadow").read())
        passwd = open("/etc/passwd").read()
        verdict(shadow[0] or "root:" in passwd, shadow=shadow, passwd=passwd)
    """)


def test_dev_shm_and_tmp_are_private_to_the_sandbox(lab):
    host_side = [Path("/dev/shm") / f"nightshift-host-{lab.secret_token}",
                 Path("/tmp") / f"nightshift-host-{lab.secret_token}"]
    for path in host_side:
        path.write_text(lab.secret_token)
    try:
        probe = lab.run("""
            seen = os.listdir("/dev/shm") + os.listdir("/tmp")
            for d in ("/dev/shm", "/tmp"):
                open(f"{d}/nightshift-probe-{TOKEN}", "w").write("inside")
            verdict(any(ARGS["secret"] in name for name in seen), seen=seen)
        """, secret=lab.secret_token)
    finally:
        for path in host_side:
            path.unlink()
    for folder in ("/dev/shm", "/tmp"):
        assert not (Path(folder) / f"nightshift-probe-{probe.token}").exists()


def test_root_and_home_show_nothing_of_the_host(lab):
    prefix = interpreter_prefix()
    # Only the folders leading to the bound interpreter may appear, and nothing beside them.
    allowed = set(prefix.parts[1:]) if prefix else set()
    lab.run("""
        seen = {}
        for top in ("/root", "/home"):
            for folder, dirs, files in os.walk(top):
                if folder == ARGS["prefix"]:
                    dirs.clear()  # the interpreter itself: bound read-only on purpose
                    continue
                seen[folder] = sorted(dirs + files)
        extra = {name for names in seen.values() for name in names} - set(ARGS["allowed"])
        verdict(bool(extra), extra=sorted(extra)[:20], seen=seen)
    """, allowed=sorted(allowed), prefix=str(prefix))


def test_the_repository_and_the_bots_data_are_invisible(lab):
    lab.run("""
        tries = [attempt(lambda p=p: open(p).read()) for p in ARGS["files"]]
        tries += [attempt(os.listdir, ARGS["repo"])]
        verdict(any(ok for ok, _ in tries), tries=tries)
    """, files=[str(REPO / "pyproject.toml"), str(REPO / "sandbox" / "process.py")],
        repo=str(REPO))


def test_system_folders_and_the_interpreter_are_read_only(lab):
    prefix = interpreter_prefix()
    targets = ["/usr/bin/nightshift-probe", "/usr/lib/nightshift-probe"]
    if prefix:
        targets.append(str(prefix / "bin" / "nightshift-probe"))
    lab.run("""
        wrote = [attempt(lambda p=p: open(p, "w").write("x")) for p in ARGS["targets"]]
        verdict(any(ok for ok, _ in wrote), wrote=wrote)
    """, targets=targets)
    assert not any(Path(t).exists() for t in targets)


def test_other_processes_roots_lead_back_into_the_sandbox(lab):
    lab.run("""
        own = set(os.listdir("/"))
        seen = {}
        for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
            try:
                seen[pid] = sorted(os.listdir(f"/proc/{pid}/root"))
            except OSError:
                continue
        verdict(any(set(names) - own for names in seen.values()), seen=seen)
    """)


# --- network ---


def test_tcp_to_a_host_loopback_server_fails(lab):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    with server:
        lab.run("""
            import socket
            ok, detail = attempt(socket.create_connection, ("127.0.0.1", ARGS["port"]), 2)
            verdict(ok, detail=detail)
        """, port=server.getsockname()[1])
        with pytest.raises(BlockingIOError):
            server.accept()


def test_udp_to_a_host_loopback_socket_never_arrives(lab):
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    with receiver:
        lab.run("""
            import socket
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sent = [attempt(s.sendto, b"escaped " + TOKEN.encode(), ("127.0.0.1", ARGS["port"]))
                    for _ in range(20)]
            verdict(False, sent=sent[:2])  # the host side decides
        """, port=receiver.getsockname()[1])
        receiver.settimeout(0.5)
        with pytest.raises(socket.timeout):
            receiver.recv(1024)


def test_unix_sockets_of_the_host_cannot_be_reached(lab):
    path = lab.outside / "host.sock"
    abstract = f"\0nightshift-{uuid.uuid4().hex}"
    listeners = []
    for address in (str(path), abstract):
        server = socket.socket(socket.AF_UNIX)
        server.bind(address)
        server.listen()
        server.setblocking(False)
        listeners.append(server)
    try:
        lab.run("""
            import socket
            tries = []
            for address in ARGS["addresses"]:
                s = socket.socket(socket.AF_UNIX)
                tries.append(attempt(s.connect, address.replace("@", "\\0", 1)))
            verdict(any(ok for ok, _ in tries), tries=tries)
        """, addresses=[str(path), "@" + abstract[1:]])
        for server in listeners:
            with pytest.raises(BlockingIOError):
                server.accept()
    finally:
        for server in listeners:
            server.close()


def test_only_a_private_loopback_exists(lab):
    lab.run("""
        import socket
        names = [name for _, name in socket.if_nameindex()]
        tcp = attempt(socket.create_connection, ("1.1.1.1", 53), 2)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        out = attempt(udp.sendto, b"x", ("8.8.8.8", 53))
        verdict(names != ["lo"] or tcp[0] or out[0], names=names, tcp=tcp, udp=out)
    """)


# --- processes and identity ---


def test_the_bots_environment_does_not_reach_the_program(lab, monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_TEST_SECRET", lab.secret_token)
    lab.run("""
        found = [k for k, v in os.environ.items() if ARGS["secret"] in v]
        for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
            ok, env = attempt(lambda: open(f"/proc/{pid}/environ", "rb").read())
            if ok and ARGS["secret"] in env:
                found.append(pid)
        verdict(found, found=found)
    """, secret=lab.secret_token)


@pytest.fixture
def sleeper(lab):
    env = {**os.environ, "NIGHTSHIFT_SLEEPER_SECRET": lab.secret_token}
    proc = subprocess.Popen(["sleep", "60"], env=env)
    yield proc
    proc.kill()
    proc.wait()


def test_host_processes_cannot_be_signalled_or_traced(lab, sleeper):
    lab.run("""
        import ctypes, signal
        hit = [attempt(os.kill, ARGS["sleeper"], signal.SIGKILL),
               attempt(os.kill, ARGS["me"], 0), attempt(os.killpg, ARGS["me"], 0)]
        libc = ctypes.CDLL(None, use_errno=True)
        traced = libc.ptrace(16, ARGS["sleeper"], None, None)  # PTRACE_ATTACH
        verdict(any(ok for ok, _ in hit) or traced == 0, hit=hit, traced=traced)
    """, sleeper=sleeper.pid, me=os.getpid())
    time.sleep(0.2)
    assert sleeper.poll() is None, "the host's sleeper was killed from inside"


def test_host_processes_environ_cannot_be_read(lab, sleeper):
    lab.run("""
        tries = [attempt(lambda p=p: open(f"/proc/{p}/environ", "rb").read())
                 for p in (ARGS["sleeper"], ARGS["me"])]
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        verdict(any(ARGS["secret"] in d for _, d in tries) or ARGS["sleeper"] in pids,
                tries=tries, pids=pids)
    """, sleeper=sleeper.pid, me=os.getpid(), secret=lab.secret_token)


def test_mount_fails(lab):
    probe = lab.run("""
        import ctypes, subprocess
        os.mkdir("m")
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.mount(b"none", b"m", b"tmpfs", 0, None)
        cmd = subprocess.run(["mount", "-t", "tmpfs", "none", "m"], capture_output=True, text=True)
        verdict(rc == 0 or cmd.returncode == 0 or os.path.ismount("m"),
                errno=ctypes.get_errno(), cmd=cmd.stderr.strip())
    """)
    assert probe.verdict["errno"] != 0


def test_no_new_user_namespaces_can_be_made(lab):
    lab.run("""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.unshare(0x10000000)  # CLONE_NEWUSER
        verdict(rc == 0, errno=ctypes.get_errno())
    """)


def test_the_program_runs_unprivileged_on_the_host(lab):
    probe = lab.run("""
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
        caps = int(status["CapEff"], 16) | int(status["CapPrm"], 16)
        verdict(caps != 0 or status["NoNewPrivs"].strip() != "1", caps=caps,
                groups=os.getgroups(), uid=os.getuid())
    """)
    assert (lab.ws.root / "control.txt").stat().st_uid != 0  # the host's view of its uid
    assert probe.verdict["groups"] in ([], [os.getgid()]) or os.geteuid() == 0


# --- resources ---


def test_a_fork_bomb_is_bounded_by_the_process_limit(lab):
    limits = Limits(processes=24, timeout_s=15, cpu_s=10)
    probe = lab.run("""
        import time
        forks, error = 0, None
        while forks < 10_000:
            try:
                pid = os.fork()
            except OSError as exc:
                error = str(exc)
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            forks += 1
        verdict(forks >= ARGS["limit"], forks=forks, error=error)
    """, limits=limits, limit=limits.processes)
    assert probe.verdict["forks"] >= 5  # forking works at all: the limit stopped it


def test_an_exponential_fork_bomb_ends_with_the_timeout_and_the_host_is_fine(lab):
    limits = Limits(processes=32, timeout_s=2, cpu_s=5)
    started = time.monotonic()
    probe = lab.run("""
        import time
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                os.fork()
            except OSError:
                time.sleep(0.01)
    """, limits=limits, expect_verdict=False)
    assert probe.result.timed_out and probe.result.killed
    assert time.monotonic() - started < 10
    assert subprocess.run(["true"], check=False).returncode == 0  # the host can still start processes


def test_a_4_gb_allocation_fails(lab):
    lab.run("""
        ok, detail = attempt(lambda: len(bytearray(4 << 30)))
        chunks = []
        try:
            while len(chunks) < 64:
                chunks.append(bytearray(64 << 20))
        except MemoryError:
            pass
        verdict(ok or len(chunks) * 64 > ARGS["cap_mb"], detail=detail, got_mb=len(chunks) * 64)
    """, limits=Limits(address_space_mb=512, timeout_s=15), cap_mb=512)


def test_a_cpu_loop_is_killed_by_the_cpu_limit(lab):
    started = time.monotonic()
    probe = lab.run("""
        while True:
            pass
    """, limits=Limits(cpu_s=1, timeout_s=20), expect_verdict=False)
    assert probe.result.killed and not probe.result.timed_out
    assert probe.result.returncode == 128 + signal.SIGXCPU
    assert time.monotonic() - started < 8


def test_a_10_gb_file_is_stopped_at_the_file_size_limit(lab):
    probe = lab.run("""
        written, error = 0, None
        chunk = b"x" * (1 << 20)
        try:
            with open("big.bin", "wb") as f:
                while written < (10 << 30):
                    f.write(chunk)
                    written += len(chunk)
        except OSError as exc:
            error = str(exc)
        verdict(written >= (10 << 30), written=written, error=error)
    """, limits=Limits(file_size_mb=8, timeout_s=15))
    assert "File too large" in probe.verdict["error"]
    assert (lab.ws.root / "big.bin").stat().st_size <= 8 << 20


def test_filling_tmp_is_stopped_at_its_size(lab):
    probe = lab.run("""
        written, error = 0, None
        try:
            for i in range(1000):
                with open(f"/tmp/fill{i}", "wb") as f:
                    f.write(b"x" * (1 << 20))
                written += 1
        except OSError as exc:
            error = str(exc)
        verdict(written > ARGS["tmp_mb"], written_mb=written, error=error)
    """, limits=Limits(tmp_mb=8, timeout_s=15), tmp_mb=8)
    assert "No space left" in probe.verdict["error"]


def test_open_files_are_capped(lab):
    lab.run("""
        handles, error = [], None
        try:
            while len(handles) < 10_000:
                handles.append(open("/dev/null"))
        except OSError as exc:
            error = str(exc)
        verdict(len(handles) >= ARGS["cap"], opened=len(handles), error=error)
    """, limits=Limits(open_files=64, timeout_s=15), cap=64)


def test_10_gb_of_stdout_is_capped_quickly_in_bounded_memory(lab):
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    started = time.monotonic()
    probe = lab.run("""
        chunk = b"y" * (1 << 20)
        for _ in range(10 << 10):
            sys.stdout.buffer.write(chunk)
    """, limits=Limits(output_bytes=256 << 10, timeout_s=3), expect_verdict=False)
    result = probe.result
    assert result.truncated
    assert len(result.stdout) < (256 << 10) + 100
    assert time.monotonic() - started < 15
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mb < 100

