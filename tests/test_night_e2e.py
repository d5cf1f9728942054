"""The whole loop on the embedded model, on CPU: a scripted day, a night whose
trainer is killed mid-training and resumed, then a new release served."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from bot import admin
from bot.runtime import Runtime
from core.config import load_config
from serving.client import LLM
from tests.scripted import ScriptedLLM, call, say

PROMPT = "Tell me a short story about a lighthouse keeper."


def day_script(messages, kwargs):
    """A day with tool calls: write a note, read it back, answer."""
    last = messages[-1]
    if last["role"] == "user":
        if "lighthouse" in last["content"]:
            return say("Ada kept the lighthouse on Gull Rock. Every night she counted the ships, "
                       "and every morning she wrote their names in a blue book.")
        return call("write_file", {"path": "note.txt", "content": last["content"]}, "w1")
    if last.get("name") == "write_file":
        return call("read_file", {"path": "note.txt"}, "r1")
    return say("I saved your note in note.txt.")


async def wait_for(rt: Runtime, job_id: int, states: tuple, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await rt.night.poll()
        job = await rt.store.job(job_id)
        if job["state"] in states:
            return job
        await asyncio.sleep(1)
    raise AssertionError(f"job {job_id} stayed {job['state']}: {json.dumps(job, default=str)[:3000]}")


async def greedy(llm: LLM) -> str:
    # A long open answer: any real change to the weights shows in its greedy continuation.
    reply = await llm.chat([{"role": "user", "content": PROMPT}], max_tokens=64, temperature=0)
    return reply.content


def changed_tensors(base: Path, release: Path) -> list[str]:
    """Names of the tensors whose stored bytes differ between two GGUF files."""
    from gguf import GGUFReader

    ours = {t.name: bytes(t.data) for t in GGUFReader(str(base)).tensors}
    return [t.name for t in GGUFReader(str(release)).tensors if ours.get(t.name) != bytes(t.data)]


@pytest.mark.slow
async def test_a_night_trains_a_new_model_that_survives_a_killed_trainer_and_goes_live(
        tmp_path, served_gguf, free_port):
    probes = tmp_path / "probes.jsonl"
    probes.write_text(json.dumps({"prompt": "What is 2 + 3?", "expected": "5"}) + "\n")
    # A config file, because the trainer runs as its own process and reads it.
    path = tmp_path / "config.toml"
    path.write_text(f"""
[paths]
data_dir = "data"
[model]
gguf = "{served_gguf}"
hf_dir = "{served_gguf.parent / 'smollm2-135m-instruct-hf'}"
[agent]
# The gate's answers stop at the reply limit: 84 of them (its open-chat prompts,
# before and after) at 128 tokens were most of this test's time; the path is under test.
max_reply_tokens = 24
[server]
port = {free_port}
[night]
auto_promote = true
gate_margin = -10.0
gate_min_items = 1
regression_margin = 10.0
probes_file = "probes.jsonl"
eval_percent = 0
window_messages = 6
understanding_fraction = 0.5
[train]
steps = 6
batch = 4
micro_batch = 2
lr = 3e-4
max_tokens = 512
""")
    config = load_config(path)
    rt = await Runtime.start(config, llm=ScriptedLLM(day_script))
    real = LLM(config, rt.supervisor)
    try:
        for channel in ("general", "notes", "general", "notes"):
            await rt.turn(channel, f"Please remember: buy milk in #{channel}")
        for _ in range(3):
            await rt.turn("general", PROMPT)
        before = await greedy(real)
        first_pid = rt.supervisor.pid

        reports = []

        async def keep(report) -> None:
            reports.append(report)

        rt.reports.listeners.append(keep)
        text = await admin.sleep(rt.store, rt.night, rt.agent, "test", "general")
        assert text.startswith("Going to sleep: night job #1")
        job = await wait_for(rt, 1, ("training", "failed"), 600)
        assert job["state"] == "training", job["error"]
        os.kill(job["pid"], signal.SIGKILL)  # kill -9 mid-training
        job = await wait_for(rt, 1, ("failed",), 30)
        assert "trainer process died" in job["error"]
        assert (await greedy(real)) == before  # the live model kept serving
        assert rt.supervisor.pid == first_pid

        await rt.night.resume(1)  # judged windows come from the night ledger
        job = await wait_for(rt, 1, ("live", "done", "failed"), 900)
        assert job["state"] == "live", (job["error"], job["progress"].get("gate"))
        assert job["progress"]["counts"]["windows_resumed"] >= 1
        releases = await rt.store.releases()
        assert [r["state"] for r in releases] == ["live"]
        assert rt.supervisor.gguf == config.data_dir / "releases/night-0001/model-q8_0.gguf"
        after = await greedy(real)
        for _ in range(60):  # the watch reports the night once it has seen it live
            if reports:
                break
            await asyncio.sleep(1)
    finally:
        await real.close()
        await rt.close()
    # A night moves a weight by ~0.1%, under q8_0's step for most of them, so the greedy
    # text may not change; the served file's quantised blocks must.
    assert changed_tensors(served_gguf, rt.supervisor.gguf), (before, after)
    assert after.strip()
    # The night report, from what the real trainer recorded: every step of the resumed
    # training, the reward sources, the gate per family (the probes), and the plots.
    [report] = reports
    assert report.job_id == 1 and report.channel == "general"
    assert [h["step"] for h in job["progress"]["train_history"]] == [1, 2, 3, 4, 5, 6]
    assert all(isinstance(h["oapl"], float) for h in job["progress"]["train_history"])
    assert "probes" in job["progress"]["gate"]["families"]
    # The live side was answered before the training (by the run that was killed; the
    # resumed one kept it), and the gate's "before" is that side.
    measured, pairs = job["progress"]["gate_before"]["scores"], job["progress"]["gate"]["items"]
    assert job["progress"]["gate_before_s"] > 0 and pairs
    assert all(measured[item] == before for item, (before, _) in pairs.items())
    assert "Training: 6 steps" in report.text and "Gate: promote." in report.text
    assert "Release: #1 night-0001 (live)" in report.text
    assert [p.read_bytes()[:8] for p in report.files] == [b"\x89PNG\r\n\x1a\n"] * 3
