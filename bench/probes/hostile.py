"""Hostile inputs: the cases of issue 11 (parts 1-3) and a few more, each through the real
path that meets them. Part 1's parsing cases run through bench/hostile.py, one fresh
process each, so their memory is measured alone; the turn and limit cases are in
``hostile_turns``.

- part 1: catastrophic grep regex, 21 MB .py outline, looping PDF, decompression-bomb image:
  a clear answer within a bound, the event loop never stalled 100 ms, bounded memory; and
  another channel's turn is answered while the regex runs;
- a 10 GB (sparse) file through every file tool and a program: bounded time and memory;
- a 100 MB attachment (announced, and one whose announced size lies): refused by size;
- a non-local model endpoint or bind host: the config is refused, naming the key;
- a missing checkpoint: a clear error before anything starts;
- a malformed tool call from the model: an observation it can act on; in a row, a clear end.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.probes import Tally, hostile_turns
from bench.probes.world import call, runtime
from core.config import Config, ConfigError, load_config
from bot.discord_front.render import save_attachments
from serving.supervisor import ServerStartError, ServerSupervisor
from sandbox.paths import workspace_for
from tests.hostile_files import CATASTROPHIC_PATTERN, catastrophic_line
from tests.scripted import call as call_reply, say
from tests.test_discord import FakeAttachment

ROOT = Path(__file__).resolve().parents[2]
PARSE_CASES = {  # bench/hostile.py's case -> (seconds, bot MB, worker MB) at most
    "grep (a+)+$": (30, 300, 600), "outline 21 MB .py": (30, 300, 1100),
    "read_pdf stalling": (60, 300, 1100), "view_image ICO bomb": (30, 300, 1100),
}


async def _parsing(tally: Tally) -> None:
    for case, (seconds, bot_mb, worker_mb) in PARSE_CASES.items():
        # Through a shell that forks it: a process exec'd straight from this one would
        # inherit this process's peak RSS as its own ru_maxrss (Linux keeps it over exec).
        done = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", '"$@"; exit $?', "sh",
            sys.executable, str(ROOT / "bench/hostile.py"), "--case", case,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(done.communicate(), 300)
        if done.returncode != 0:
            tally.check(f"{case}: the case ran", False, err[-300:])
            continue
        r = json.loads(out)
        tally.check(f"{case}: a clear answer in {r['seconds']:.1f} s (<= {seconds} s)",
                    r["seconds"] <= seconds and r["output"], r["output"])
        tally.check(f"{case}: the event loop stalled {r['lag'] * 1000:.0f} ms (< 100)",
                    r["lag"] < 0.1)
        tally.check(f"{case}: memory bot {r['bot_mb']:.0f} MB, worker {r['worker_mb']:.0f} MB",
                    r["bot_mb"] <= bot_mb and r["worker_mb"] <= worker_mb)


async def _other_channel_answers(tally: Tally, work: Path) -> None:
    """While one channel's catastrophic grep runs, another channel's turn is answered."""
    async with runtime(work / "busy") as rt:
        (rt.spaces.context("slow").workspace.root / "a.txt").write_text(catastrophic_line(30))
        grep = asyncio.create_task(call(rt, "slow", "grep", pattern=CATASTROPHIC_PATTERN))
        await asyncio.sleep(1)
        start = time.monotonic()
        other = await rt.turn("quick", "hello")
        took, running = time.monotonic() - start, not grep.done()
        result = await grep
        tally.check(f"another channel is answered in {took:.2f} s while the regex runs",
                    other.ok and took < 2 and running, (other, running, result.output[:100]))


SPARSE_CALLS = [("read_file", {"path": "big.bin"}), ("read_file", {"path": "big.bin", "offset": 10**8}),
                ("grep", {"pattern": "x"}), ("outline", {"path": "big.bin"}),
                ("file_info", {"path": "big.bin"}), ("read_pdf", {"path": "big.bin"}),
                ("view_image", {"path": "big.bin"}),
                ("edit_file", {"path": "big.bin", "mode": "insert", "after": 0, "text": "x"}),
                ("write_file", {"path": "copy.bin", "content": "x"}), ("send_file", {"path": "big.bin"}),
                ("git_add", {"paths": ["big.bin"]}), ("tree", {}), ("health", {}),
                ("run_python", {"code": "print(len(open('big.bin', 'rb').read()))"})]


def _peak_kb() -> int:
    """This process's peak resident memory (VmHWM), in KiB."""
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0])


def _reset_peak() -> int:
    """Reset the peak to the current resident memory (Linux >= 4.0); returns it, in KiB.
    ru_maxrss cannot be reset: an earlier category's peak would hide this one's."""
    Path("/proc/self/clear_refs").write_text("5")
    return _peak_kb()


async def _sparse(tally: Tally, work: Path) -> None:
    async with runtime(work / "sparse") as rt:
        root = rt.spaces.context("c").workspace.root
        with open(root / "big.bin", "wb") as f:
            f.truncate(10 * 2**30)  # 10 GB that take no disk
        await call(rt, "c", "git_status")
        for name, arguments in SPARSE_CALLS:
            before = _reset_peak()
            start = time.monotonic()
            result = await call(rt, "c", name, **arguments)
            took = time.monotonic() - start
            grew = (_peak_kb() - before) / 1024
            tally.check(f"10 GB file, {name}: {took:.1f} s, the bot grew {grew:.0f} MB",
                        took < 60 and grew < 200 and len(result.output) <= 20_000,
                        f"ok={result.ok}: {result.output[:160]!r}")


async def _attachments(tally: Tally, work: Path) -> None:
    workspace = workspace_for(work / "uploads-ws", "c")
    big = b"\0" * (100 * 2**20)
    notes = await save_attachments([FakeAttachment("big.bin", big),
                                    FakeAttachment("liar.bin", big, size=1024)], workspace)
    saved = list((workspace.root / "uploads").iterdir()) if (workspace.root / "uploads").exists() else []
    tally.check("a 100 MB attachment is refused by its size", notes[0].startswith("[not saved: big.bin")
                and "limit" in notes[0], notes[0])
    tally.check("a 100 MB attachment announced as 1 KiB is refused too",
                notes[1].startswith("[not saved: liar.bin"), notes[1])
    tally.check("neither attachment is on disk", saved == [], saved)


CONFIGS = {
    "a public endpoint IP": '[server]\nkind = "external"\nendpoint = "http://8.8.8.8:8080/v1"\n',
    "a public endpoint name": '[server]\nkind = "external"\nendpoint = "https://api.openai.com/v1"\n',
    "a public IPv6 endpoint": '[server]\nkind = "external"\nendpoint = "http://[2001:4860::8888]/v1"\n',
    "a public bind host": '[server]\nhost = "8.8.8.8"\n',
    "a missing checkpoint": '[model]\ngguf = "/no/such/model.gguf"\n',
}


async def _configs(tally: Tally, work: Path) -> None:
    for name, text in CONFIGS.items():
        path = work / f"{name.replace(' ', '-')}.toml"
        path.write_text(text)
        try:
            load_config(path)
            message = ""
        except ConfigError as exc:
            message = str(exc)
        key = "model.gguf" if "checkpoint" in name else "server."
        tally.check(f"config with {name}: refused, naming the key", key in message, message[:200])
    config = Config()
    config.paths.data_dir = work / "missing"
    supervisor = ServerSupervisor(config, gguf=work / "no-such.gguf")
    try:
        await supervisor.start()
        message = ""
    except ServerStartError as exc:
        message = str(exc)
    tally.check("the server with a missing GGUF: a clear error, nothing started",
                "no-such.gguf" in message and supervisor.pid is None, message[:200])
    from tests.test_train import _rows

    rows = work / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in _rows()))
    done = subprocess.run([sys.executable, "-m", "trainer.train", "--data", str(rows),
                           "--base", "/no/base", "--out", str(work / "out")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    tally.check("the trainer with a missing checkpoint: one line naming it, no traceback",
                done.returncode == 2 and "the base checkpoint /no/base is missing" in done.stderr
                and "Traceback" not in done.stderr, done.stderr[-300:])


async def _malformed(tally: Tally, work: Path) -> None:
    replies = [call_reply("read_file", "{not json"), say("sorry, done")]
    async with runtime(work / "malformed", lambda m, k: replies.pop(0) if replies
                       else call_reply("read_file", '{"path": ')) as rt:
        result = await rt.turn("c", "read a file")
        observation = next((m["content"] for m in rt.llm.calls[-1][0] if m["role"] == "tool"), "")
        tally.check("a malformed tool call comes back as an observation naming the JSON error",
                    result.ok and "not valid JSON" in observation, observation[:200])
        start = time.monotonic()
        ended = await rt.turn("c", "again")
        tally.check("malformed calls in a row end the turn with a clear message",
                    time.monotonic() - start < 30 and ended.reply and not ended.reply.startswith("{"),
                    ended)
        episodes = await rt.store.episodes_since(0, "c")
        tally.check("both turns are stored", len(episodes) == 2, [e.status for e in episodes])


async def run(tally: Tally, work: Path, quick: bool) -> None:
    await _parsing(tally)
    await _other_channel_answers(tally, work)
    await _sparse(tally, work)
    await _attachments(tally, work)
    await _configs(tally, work)
    await _malformed(tally, work)
    await hostile_turns.run(tally, work, quick)
