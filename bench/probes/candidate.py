"""A bad candidate: releases that must never go live, on the real llama.cpp server, and a
night whose candidate fails the real gate.

- corrupt GGUFs whose checksums match (random bytes after the magic, and the real model cut
  to its first MiB): the blue-green swap's new server fails its start, the answer says the
  old model keeps serving, the old process still serves (same pid), the release stays a
  candidate, and no process serves the corrupt file; once more in restart mode (one GPU),
  where the old model is started again;
- a release whose file no longer matches release.json, and one without release.json:
  refused before any swap;
- auto-promote tries a failing candidate once, not at every poll of the night watch;
- a failed gate: the real gate (trainer.gate, greedy answers of the real model, a scripted
  judge) on the same model before and after finds no gain and rejects; the night ends
  ``done`` with the release ``rejected``, the watch promotes nothing, /promote has no
  candidate, and the base model still serves.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from pathlib import Path

from bench.probes import Tally
from bench.probes.wedged import base_config, free_port, timed_turn
from bot.commands import Caller, run_command
from bot.runtime import Runtime
from serving.supervisor import ServerSupervisor
from tests.conftest import DEFAULT_GGUF
from tests.judge_server import JudgeServer
from tests.test_swap import serving

ADMIN = Caller(1, (), "c", "admin (1)")


def release(data_dir: Path, name: str, gguf_bytes: bytes, *, tamper: bool = False,
            manifest: bool = True) -> tuple[str, dict]:
    folder = data_dir / "releases" / name
    folder.mkdir(parents=True)
    gguf = folder / "model-q8_0.gguf"
    gguf.write_bytes(gguf_bytes)
    if manifest:
        files = {gguf.name: hashlib.sha256(gguf_bytes).hexdigest()}
        (folder / "release.json").write_text(json.dumps({"files": files,
                                                         "serve": {"gguf": gguf.name}}))
    if tamper:
        gguf.write_bytes(gguf_bytes[:-1] + b"!")
    return str(folder), {"gguf": str(gguf)}


async def _promote_refused(tally: Tally, rt: Runtime, swaps: list, name: str, gguf: bytes,
                           expect: str, *, swapped: bool, **kind) -> None:
    rid = await rt.store.add_release(name, *release(rt.config.data_dir, name, gguf, **kind))
    pid, count = rt.supervisor.pid, len(swaps)
    answer = (await run_command(rt, ADMIN, "promote", release_id=rid)).text
    state = {r["id"]: r["state"] for r in await rt.store.releases()}[rid]
    same_pid = rt.supervisor.pid == pid or rt.config.night.single_gpu
    tally.check(f"{name}: promote refused ({expect})", expect in answer and state == "candidate"
                and rt.supervisor.gguf == DEFAULT_GGUF and same_pid, (answer[:300], state))
    tally.check(f"{name}: {'one swap tried' if swapped else 'no swap tried'}",
                len(swaps) - count == (1 if swapped else 0), len(swaps) - count)
    tally.check(f"{name}: nothing serves the bad file",
                serving(Path(rt.config.data_dir / "releases" / name / "model-q8_0.gguf")) == [])
    turn, _ = await timed_turn(rt, "c", "Say hi.", 120)
    tally.check(f"{name}: the old model keeps answering", getattr(turn, "ok", False), turn)


async def _auto_promote_once(tally: Tally, rt: Runtime, swaps: list) -> None:
    name = "night-auto"
    rid = await rt.store.add_release(name, *release(rt.config.data_dir, name,
                                                    b"GGUF" + os.urandom(4096)))
    job = await rt.store.create_job("sleep", {})
    await rt.store.update_job(job, state="awaiting_promotion", progress={"release_id": rid})
    count = len(swaps)
    # The runtime's own watch polls every interval_s (2 s): let it poll several times.
    deadline = time.monotonic() + 60
    while "promotion" not in (await rt.store.job(job))["progress"] and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    await asyncio.sleep(5 * rt.night.interval_s)
    got = await rt.store.job(job)
    tally.check("auto-promote tries a failing candidate once, not at every poll of the watch",
                len(swaps) - count == 1 and got["state"] == "awaiting_promotion"
                and "failed to start" in got["progress"].get("promotion", ""),
                (len(swaps) - count, got["state"], got["progress"].get("promotion", "")[:200]))


async def _failed_gate(tally: Tally, rt: Runtime, swaps: list) -> None:
    from trainer.gate import run_gate
    from trainer.sleep import Night, finish

    judge = await JudgeServer(lambda kind, body: {"score": 1}).start()
    start = time.monotonic()
    try:
        config = rt.config.model_copy(deep=True)
        config.server.kind, config.server.endpoint = "external", judge.url
        config.night.gate_min_items = 4
        view = config.data_dir / "view.json"
        view.write_text(json.dumps({"system": "Answer with the number only.", "tools": []}))
        heldout = config.data_dir / "heldout.jsonl"
        heldout.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i} + 1?",
                                               "check": {"exact": str(i + 1)}}) + "\n"
                                   for i in range(4)))
        report = await run_gate(config, rt.store, [], {"agent_view": str(view),
                                                       "heldout": [str(heldout)]},
                                (DEFAULT_GGUF, None), (DEFAULT_GGUF, None))
    finally:
        await judge.stop()
    tally.notes.append(f"the real gate (4 held-out items, {len(judge.requests)} judge requests): "
                       f"{time.monotonic() - start:.0f} s")
    tally.check("the real gate rejects a candidate with no gain", report.outcome == "reject",
                (report.outcome, report.reasons))
    name = "night-gated"
    rid = await rt.store.add_release(name, *release(rt.config.data_dir, name, b"GGUF" + b"\0" * 64))
    job = await rt.store.create_job("sleep", {})
    await finish(Night(rt.config, rt.store, job), rt.store, report.as_dict(), rid)
    count = len(swaps)
    await asyncio.sleep(3 * rt.night.interval_s)  # the watch's own polls
    states = {r["id"]: r["state"] for r in await rt.store.releases()}
    got = await rt.store.job(job)
    tally.check("a failed gate ends the night done with the release rejected",
                got["state"] == "done" and states[rid] == "rejected", (got["state"], states[rid]))
    tally.check("the night watch promotes nothing after a failed gate", len(swaps) == count)
    answer = (await run_command(rt, ADMIN, "promote", release_id=rid)).text
    tally.check("/promote of the rejected release is refused", "not a candidate" in answer, answer)
    tally.check("the base model still serves", rt.supervisor.gguf == DEFAULT_GGUF)


async def run(tally: Tally, work: Path, quick: bool) -> None:
    config = base_config(work)
    config.server.port = free_port()
    config.night.auto_promote = True
    config.discord.admin_user_ids = [1]
    rt = await Runtime.start(config, supervisor=ServerSupervisor(config, gguf=DEFAULT_GGUF))
    swaps: list = []
    original = rt.supervisor.swap

    async def counting(gguf, **kwargs):
        swaps.append(gguf)
        return await original(gguf, **kwargs)

    rt.supervisor.swap = counting
    real = DEFAULT_GGUF.read_bytes()[: 1 << 20]
    start = time.monotonic()
    try:
        await _promote_refused(tally, rt, swaps, "night-random", b"GGUF" + os.urandom(4096),
                               "the old model keeps serving", swapped=True)
        await _promote_refused(tally, rt, swaps, "night-truncated", real,
                               "the old model keeps serving", swapped=True)
        await _promote_refused(tally, rt, swaps, "night-tampered", real,
                               "does not match its SHA-256", swapped=False, tamper=True)
        await _promote_refused(tally, rt, swaps, "night-unsigned", real,
                               "release.json is missing", swapped=False, manifest=False)
        if not quick:
            rt.config.night.single_gpu = True  # restart mode: stop, fail, start the old again
            await _promote_refused(tally, rt, swaps, "night-restart-mode", real,
                                   "failed to start", swapped=True)
            rt.config.night.single_gpu = False
        await _auto_promote_once(tally, rt, swaps)
        tally.notes.append(f"server start and bad releases: {time.monotonic() - start:.0f} s")
        await _failed_gate(tally, rt, swaps)
    finally:
        await rt.close()
