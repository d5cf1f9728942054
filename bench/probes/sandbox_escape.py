"""Sandbox escape probes: programs run through ``run_python``, file-tool calls and the parse
worker's jail that try to reach the host, all through the real runtime's tools and sandbox.

Each program prints ``VERDICT {"escaped": ...}``; where the host can look for itself (a
file written, a connection accepted, a process killed or left behind) it does, and a
missing verdict counts as a failure too (the probe did not run, so it proved nothing).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from bench.probes import Tally
from bench.probes.world import call, processes_with, runtime, verdict
from tools import worker

CHANNEL = "attacker"
PRELUDE = """\
import json, os, socket, sys
A = json.loads({args!r})
def verdict(escaped, **detail):
    print("VERDICT " + json.dumps({{"escaped": bool(escaped), **detail}}), flush=True)
def attempt(fn, *args):
    try:
        return True, repr(fn(*args))[:200]
    except Exception as exc:
        return False, f"{{type(exc).__name__}}: {{exc}}"[:200]
"""

PROGRAMS = {
    "read a host file by absolute path": """
ok, got = attempt(lambda: open(A["secret_path"]).read())
verdict(A["secret"] in got, got=got)""",
    "see the repository, the data dir or /work": """
seen = {p: os.path.exists(p) for p in A["host_paths"]}
verdict(any(seen.values()), seen=seen)""",
    "find the bot's environment or command line in /proc": """
hits = []
for pid in os.listdir("/proc"):
    for part in ("environ", "cmdline"):
        try:
            if A["env_token"].encode() in open(f"/proc/{pid}/{part}", "rb").read():
                hits.append(f"{pid}/{part}")
        except OSError:
            pass
verdict(hits or A["env_token"] in str(os.environ), hits=hits)""",
    "signal a host process": """
ok, got = attempt(os.kill, A["canary_pid"], 15)
verdict(ok, got=got)""",
    "connect to a host TCP port": """
s = socket.socket(); s.settimeout(2)
ok, got = attempt(s.connect, ("127.0.0.1", A["port"]))
verdict(ok, got=got)""",
    "connect to a host abstract unix socket": """
s = socket.socket(socket.AF_UNIX); s.settimeout(2)
ok, got = attempt(s.connect, "\\0" + A["abstract"])
verdict(ok, got=got)""",
    "resolve a name or reach the internet": """
dns, got1 = attempt(socket.getaddrinfo, "pypi.org", 443)
s = socket.socket(); s.settimeout(2)
net, got2 = attempt(s.connect, ("1.1.1.1", 53))
verdict(dns or net, dns=got1, net=got2)""",
    "write outside the workspace": """
wrote = {p: attempt(lambda p=p: open(p, "w").write("escaped"))[0] for p in A["write_paths"]}
verdict(any(v for p, v in wrote.items() if not p.startswith("/tmp/")), wrote=wrote)""",
    "become root or open raw devices": """
su, got1 = attempt(os.setuid, 0)
mem, got2 = attempt(lambda: open("/dev/mem", "rb").read(16))
disk, got3 = attempt(lambda: open("/dev/vda", "rb").read(16))
verdict(su or mem or disk or os.getuid() == 0, setuid=got1, mem=got2, disk=got3)""",
    "allocate 3 GiB": """
ok, got = attempt(lambda: len(bytearray(3 << 30)))
verdict(ok, got=got)""",
    "write a 300 MB file": """
def fill():
    with open("big.bin", "wb") as f:
        for _ in range(300):
            f.write(b"x" * (1 << 20))
ok, got = attempt(fill)
verdict(ok, got=got, size=os.path.getsize("big.bin") if os.path.exists("big.bin") else 0)""",
    "read a host-planted symlink to a host file": """
got = [attempt(lambda p=p: open(p).read()) for p in ("planted_abs", "planted_rel")]
verdict(any(A["secret"] in d for _, d in got), got=got)""",
}


class Host:
    """What the probes attack: a secret outside the workspace, a canary process, a listener."""

    def __init__(self, work: Path, rt) -> None:
        token = uuid.uuid4().hex
        self.token = token
        self.outside = work / f"outside-{token[:8]}"
        self.outside.mkdir()
        self.secret = f"host-secret-{token}"
        self.secret_path = self.outside / "secret.txt"
        self.secret_path.write_text(self.secret)
        (self.outside / f"neighbour-{token[:8]}.txt").write_text("x")
        self.canary = subprocess.Popen(["sleep", "600"])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.abstract = f"nightshift-{token}"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind("\0" + self.abstract)
        self.unix.listen()
        self.unix.setblocking(False)
        self.rt = rt
        self.root = rt.spaces.context(CHANNEL).workspace.root
        repo = Path(__file__).resolve().parents[2]
        self.args = {
            "secret": self.secret, "secret_path": str(self.secret_path),
            "host_paths": [str(repo), str(rt.config.data_dir), "/work", str(self.outside)],
            "env_token": os.environ["NIGHTSHIFT_PROBE_TOKEN"], "canary_pid": self.canary.pid,
            "port": self.listener.getsockname()[1], "abstract": self.abstract,
            "write_paths": [str(repo / f"escaped-{token}"), str(self.outside / "escaped"),
                            f"/usr/escaped-{token}", f"/etc/escaped-{token}",
                            f"/tmp/escaped-{token}", str(self.secret_path)],
        }

    def accepted_anything(self) -> bool:
        for server in (self.listener, self.unix):
            try:
                server.accept()[0].close()
                return True
            except BlockingIOError:
                pass
        return False

    def close(self) -> None:
        self.canary.kill()
        self.canary.wait()
        self.listener.close()
        self.unix.close()


async def _program(tally: Tally, host: Host, name: str) -> None:
    code = PRELUDE.format(args=json.dumps(host.args)) + PROGRAMS[name]

    async def attempt():
        result = await call(host.rt, CHANNEL, "run_python", code=code, timeout_s=60)
        found = verdict(result)
        if found is None:
            return False, f"no verdict: {result.output[:300]}"
        return not found["escaped"], found

    await tally.probe(f"run_python: {name}", attempt)


async def _host_side(tally: Tally, host: Host) -> None:
    written = [p for p in host.args["write_paths"] if p != str(host.secret_path)
               and os.path.exists(p)]
    tally.check("host side: nothing written outside the workspace", not written, written)
    tally.check("host side: the host file is unchanged", host.secret_path.read_text() == host.secret)
    tally.check("host side: the canary process lives", host.canary.poll() is None)
    tally.check("host side: no connection reached the host", not host.accepted_anything())
    big = host.root / "big.bin"
    size = big.stat().st_size if big.exists() else 0
    tally.check("host side: the 300 MB file was cut at the file-size limit", size <= 100 << 20, size)


async def _bounded(tally: Tally, host: Host, token: str) -> None:
    """A fork bomb, a CPU spin and an output flood end in bounded time, leaving nothing."""
    bomb = ("import os, sys\nos.execv(sys.executable, ['python3-" + token + "', '-c', "
            "'import os\\nwhile True:\\n    try: os.fork()\\n    except OSError: pass'])")
    cases = [("fork bomb", bomb, 5, 60), ("CPU spin", "while True: pass", 3, 40),
             ("100 MB of output", "import sys\nfor _ in range(100): sys.stdout.write('y' * (1 << 20))",
              60, 60)]
    for name, code, timeout_s, bound in cases:
        async def attempt(code=code, timeout_s=timeout_s, bound=bound):
            start = time.monotonic()
            result = await call(host.rt, CHANNEL, "run_python", code=code, timeout_s=timeout_s)
            took = time.monotonic() - start
            await asyncio.sleep(1)
            left = processes_with(token)
            return took < bound and not left and len(result.output) <= 20_000, \
                f"{took:.1f} s, left {left}, {len(result.output)} chars: {result.output[:120]!r}"

        await tally.probe(f"run_python: {name} ends in bounded time", attempt)
    after = await call(host.rt, CHANNEL, "run_python", code="print('still serving')")
    tally.check("the sandbox still serves after the bounded cases", "still serving" in after.output,
                after.output[:200])


def _file_tool_calls(host: Host) -> list[tuple[str, dict]]:
    rel = os.path.relpath(host.secret_path, host.root)
    secret, outside = str(host.secret_path), str(host.outside)
    return [
        ("read_file", {"path": secret}), ("read_file", {"path": rel}),
        ("read_file", {"path": "/etc/passwd"}), ("read_file", {"path": "link_abs"}),
        ("read_file", {"path": "link_rel"}), ("read_file", {"path": "planted_abs"}),
        ("read_file", {"path": "linkdir/secret.txt"}),
        ("list_dir", {"path": ".."}), ("list_dir", {"path": outside}),
        ("list_dir", {"path": "linkdir"}), ("tree", {"path": ".."}),
        ("glob", {"pattern": "../**/*"}), ("glob", {"pattern": outside + "/*"}),
        ("grep", {"pattern": "host-secret", "path": ".."}),
        ("grep", {"pattern": "host-secret", "path": outside}),
        ("grep", {"pattern": "host-secret", "path": "linkdir"}),
        ("file_info", {"path": secret}), ("outline", {"path": "link_abs"}),
        ("read_pdf", {"path": "link_abs"}), ("view_image", {"path": "link_abs"}),
        ("send_file", {"path": "link_abs"}), ("send_file", {"path": rel}),
        ("write_file", {"path": "link_abs", "content": "pwned"}),
        ("write_file", {"path": rel + ".new", "content": "pwned"}),
        ("edit_file", {"path": "link_abs", "mode": "replace_text", "old": "host", "new": "pwned"}),
        ("delete", {"path": "link_abs"}), ("delete", {"path": rel}),
        ("make_dir", {"path": "../escaped-dir"}), ("git_add", {"paths": [rel]}),
        ("git_checkout_file", {"path": rel}),
    ]


async def _file_tools(tally: Tally, host: Host) -> None:
    """Symlinks the agent makes (and one planted by the host) and paths out of the workspace."""
    made = await call(host.rt, CHANNEL, "run_python", code=(
        f"import os\nos.symlink({str(host.secret_path)!r}, 'link_abs')\n"
        f"os.symlink({os.path.relpath(host.secret_path, host.root)!r}, 'link_rel')\n"
        f"os.symlink({str(host.outside)!r}, 'linkdir')\nprint('made')"))
    tally.check("the agent could make its symlinks (the probe's control)", "made" in made.output,
                made.output[:200])
    neighbour = f"neighbour-{host.token[:8]}"
    for name, arguments in _file_tool_calls(host):
        async def attempt(name=name, arguments=arguments):
            result = await host.rt.registry.call(name, arguments, host.rt.spaces.context(CHANNEL))
            leaked = host.secret in result.output or neighbour in result.output
            outbox = host.rt.spaces.context(CHANNEL).services.outbox or []
            sent_out = any(Path(p).resolve() == host.secret_path.resolve() for p in outbox)
            return not leaked and not sent_out, f"ok={result.ok}: {result.output[:200]!r}"

        await tally.probe(f"{name}({json.dumps(arguments)[:60]})", attempt)
    tally.check("host side: the host file survived the file tools",
                host.secret_path.read_text() == host.secret)
    tally.check("host side: no folder made outside", not (host.root.parent / "escaped-dir").exists())


async def _parse_worker(tally: Tally, host: Host) -> None:
    """Code run by an exploited PDF or image parser, standing in as the worker's probe task
    in the same jail: the canary inherited the bot's environment, so its environ holds the
    token; the host secret and the repository are files of the bot's."""
    paths = [f"/proc/{pid}/environ" for pid in (1, 2, 3, os.getpid(), host.canary.pid)]
    paths += [host.args["secret_path"], *host.args["host_paths"], "/proc/self/environ"]
    box = host.rt.spaces.context(CHANNEL).services.sandbox

    async def attempt():
        seen = await asyncio.to_thread(worker.run, "probe_packages", {"read": paths},
                                       what="probing the parse worker", box=box)
        text = json.dumps(seen)
        leaked = host.args["env_token"] in text or host.secret in text
        return not leaked and seen["uid"] != 0, {"uid": seen["uid"], "read": seen["read"]}

    await tally.probe("parse worker: read the bot's environ and a host file", attempt)


async def run(tally: Tally, work: Path, quick: bool) -> None:
    token = uuid.uuid4().hex
    os.environ["NIGHTSHIFT_PROBE_TOKEN"] = f"env-{token}"  # inherited by nothing in the sandbox
    async with runtime(work) as rt:
        host = Host(work, rt)
        try:
            os.symlink(host.secret_path, host.root / "planted_abs")
            os.symlink(os.path.relpath(host.secret_path, host.root), host.root / "planted_rel")
            for name in PROGRAMS:
                await _program(tally, host, name)
            await _host_side(tally, host)
            await _file_tools(tally, host)
            await _parse_worker(tally, host)
            await _bounded(tally, host, token)
        finally:
            host.close()
