"""The night's bookkeeping: what a night collects, what it keeps, what serves.

Each test runs the real store, the bot's admin actions and night watch, and
the trainer's own collection and end-of-night code (``trainer.sleep.finish``),
with the training itself left out: it has its own tests.
"""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import time

from bot import admin
from bot.app import finish_nights
from bot.console import ConsoleRenderer
from bot.runtime import Runtime
from serving.releases import serve_live
from tests.scripted import ScriptedLLM, say
from tests.test_nightwatch import SwappingServer, make_release, runtime
from trainer.collect import collect
from trainer.live import live_model
from trainer.secrets import SecretScanner
from trainer.sleep import Night, finish


async def chat(rt: Runtime, text: str) -> int:
    rt.llm.script.append(say("ok"))  # the runtime's ScriptedLLM
    return (await rt.turn("general", text)).episode_id


async def collected(rt: Runtime, job: dict, base_release) -> list[int]:
    """What the night job would train on: its since, its base release's episodes."""
    found = await collect(rt.store, SecretScanner([]), 0, job["args"]["since"], None,
                          base_release)
    return [e.id for e in found.episodes]


async def run_night(rt: Runtime, outcome: str) -> dict:
    """A night as the trainer runs it, up to its gate's outcome (training left out)."""
    text = await admin.sleep(rt.store, rt.night, rt.agent, "test", "general")
    assert text.startswith("Going to sleep")
    job = (await rt.store.jobs("sleep"))[-1]
    night = Night(rt.config, rt.store, job["id"])
    night.progress = {"since": job["args"]["since"], "collected_until": time.time()}
    path, meta = make_release(rt.config.data_dir, f"night-{job['id']:04d}")
    release = await rt.store.add_release(f"night-{job['id']:04d}", path, meta)
    await finish(night, rt.store, {"outcome": outcome, "reasons": [f"planted {outcome}"]},
                 release)
    return job


async def test_no_data_is_lost_after_a_rejected_or_inconclusive_night(tmp_path):
    rt = await runtime(tmp_path)
    try:
        day1 = [await chat(rt, "one"), await chat(rt, "two")]
        rejected = await run_night(rt, "reject")
        day2 = [await chat(rt, "three")]
        got = await rt.store.job(rejected["id"])
        assert got["state"] == "done" and got["progress"]["outcome"] == "reject"
        assert "stay for the next night" in got["progress"]["note"]
        assert [r["state"] for r in await rt.store.releases()] == ["rejected"]
        inconclusive = await run_night(rt, "inconclusive")
        # The next night collects the rejected night's episodes again, with the new ones.
        assert await collected(rt, inconclusive, None) == day1 + day2
        assert [r["state"] for r in await rt.store.releases()] == ["rejected", "candidate"]
        day3 = [await chat(rt, "four")]
        third = await run_night(rt, "promote")
        assert await collected(rt, third, None) == day1 + day2 + day3
        assert (await rt.store.job(third["id"]))["state"] == "awaiting_promotion"
    finally:
        await rt.close()


async def test_after_a_promoted_night_the_next_collects_from_where_it_stopped(tmp_path):
    rt = await runtime(tmp_path)
    try:
        await chat(rt, "before")
        promoted = await run_night(rt, "promote")
        text = await admin.promote(rt.releases)
        assert text.startswith("Now serving"), text
        assert (await rt.store.job(promoted["id"]))["state"] == "live"
        after = [await chat(rt, "after")]
        nxt = await run_night(rt, "reject")
        until = (await rt.store.job(promoted["id"]))["progress"]["collected_until"]
        assert nxt["args"]["since"] == until > 0
        [live] = [r for r in await rt.store.releases() if r["state"] == "live"]
        assert await collected(rt, nxt, live["id"]) == after
    finally:
        await rt.close()


async def test_each_episode_records_its_release_and_a_night_takes_only_its_bases(tmp_path):
    rt = await runtime(tmp_path)
    try:
        on_base = await chat(rt, "served by the base model")
        path, meta = make_release(tmp_path)
        release = await rt.store.add_release("night-0001", path, meta)
        assert (await admin.promote(rt.releases, release)).startswith("Now serving")
        on_release = await chat(rt, "served by the release")
        episodes = {e.id: e.release_id for e in await rt.store.episodes_since(0)}
        assert episodes == {on_base: None, on_release: release}
        _, _, _, base = await live_model(rt.config, rt.store)
        assert base == release
        found = await collect(rt.store, SecretScanner([]), 0, 0.0, None, base)
        assert [e.id for e in found.episodes] == [on_release]
        assert found.excluded["other-release"] == 1
    finally:
        await rt.close()


async def test_auto_promote_tries_once_per_candidate(tmp_path):
    rt = await runtime(tmp_path, auto_promote=True)
    try:
        failures = []

        async def broken_swap(gguf, **kw):
            failures.append(gguf)
            raise RuntimeError("canary failed")

        rt.supervisor.swap = broken_swap
        job = await run_night(rt, "promote")
        for _ in range(3):
            await rt.night.poll()
        assert len(failures) == 1
        got = await rt.store.job(job["id"])
        assert got["state"] == "awaiting_promotion"
        assert "failed to start" in got["progress"]["promotion"]
    finally:
        await rt.close()


async def test_promoting_a_candidate_that_a_newer_one_was_built_on_is_refused(tmp_path):
    rt = await runtime(tmp_path)
    try:
        older_path, older_meta = make_release(tmp_path, "night-0001")
        older = await rt.store.add_release("night-0001", older_path, older_meta)
        newer_path, newer_meta = make_release(tmp_path, "night-0002")
        newer = await rt.store.add_release("night-0002", newer_path,
                                           {**newer_meta, "base_release_id": older})
        text = await admin.promote(rt.releases, older)
        assert text.startswith(f"Release #{older} refused: release(s) #{newer} were trained "
                               "on top of it") and f"Promote #{newer} instead" in text
        assert rt.supervisor.swaps == []
        assert (await admin.promote(rt.releases, newer)).startswith("Now serving")
        # Once the newer one is rejected, the older one may be served again.
        await rt.store.set_release_state(newer, "rejected")
        assert (await admin.promote(rt.releases, older)).startswith("Now serving")
    finally:
        await rt.close()


async def test_a_restarted_bot_serves_the_live_release(tmp_path):
    rt = await runtime(tmp_path)
    path, meta = make_release(tmp_path)
    release = await rt.store.add_release("night-0001", path, meta)
    assert (await admin.promote(rt.releases, release)).startswith("Now serving")
    await rt.close()
    fresh = SwappingServer(tmp_path / "base.gguf")  # a new process starts from the config
    again = await Runtime.start(rt.config, supervisor=fresh, llm=ScriptedLLM([]),
                                start_server=False)
    try:
        assert fresh.gguf == tmp_path / "releases/night-0001/model-q8_0.gguf"
        text = await admin.status(again.store, again.supervisor, again.workers)
        assert text.startswith("model: night-0001")
    finally:
        await again.close()


async def test_a_corrupt_live_release_is_retired_at_start_and_the_base_serves(tmp_path):
    rt = await runtime(tmp_path)
    try:
        path, meta = make_release(tmp_path)
        release = await rt.store.add_release("night-0001", path, meta)
        await rt.store.set_release_state(release, "live")
        (tmp_path / "releases/night-0001/model-q8_0.gguf").write_bytes(b"GGUF tampered")
        fresh = SwappingServer(tmp_path / "base.gguf")
        assert await serve_live(rt.store, fresh) is None
        assert fresh.gguf == tmp_path / "base.gguf"
        assert [r["state"] for r in await rt.store.releases()] == ["retired"]
    finally:
        await rt.close()


async def test_the_consoles_end_of_input_lets_a_running_night_finish(tmp_path):
    rt = await runtime(tmp_path)
    try:
        trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        job = await rt.store.create_job("sleep", {})
        await rt.store.update_job(job, state="training", pid=trainer.pid)
        err = io.StringIO()

        async def trainer_finishes():
            await asyncio.sleep(0.2)
            await rt.store.update_job(job, state="exporting")
            await asyncio.sleep(0.2)
            await rt.store.update_job(job, state="done", progress={
                "gate": {"outcome": "reject", "reasons": ["planted"]}})

        sent = []

        async def listener(report):
            sent.append(report)

        rt.reports.listeners.append(listener)
        finishing = asyncio.create_task(trainer_finishes())
        try:
            await finish_nights(rt, ConsoleRenderer(io.StringIO(), err), interval_s=0.05)
            # The report is out before the console stops, whether the watch or the console
            # sent it, and once (the console stopped before the watch sent it, once).
            assert [r.job_id for r in sent] == [job]
            await finishing
            assert trainer.poll() is None  # the night was waited for, not killed
        finally:
            trainer.kill()
            trainer.wait()
        lines = err.getvalue().splitlines()
        assert lines[0].startswith(f"End of input, but night #{job} is still running")
        assert lines[-1] == f"The night finished: Night #{job}: done · gate: reject (planted)"
    finally:
        await rt.close()


async def test_a_night_without_a_live_trainer_does_not_hold_the_console(tmp_path):
    rt = await runtime(tmp_path)
    try:
        job = await rt.store.create_job("sleep", {})  # queued, but no process ever took it
        err = io.StringIO()
        await asyncio.wait_for(finish_nights(rt, ConsoleRenderer(io.StringIO(), err)), 5)
        assert err.getvalue() == "" and (await rt.store.job(job))["state"] == "queued"
    finally:
        await rt.close()


def test_adapter_mode_continues_the_live_adapter_and_merged_mode_starts_fresh(tmp_path):
    from core.config import Config
    from trainer.live import live_adapter

    release = tmp_path / "night-0003"
    release.mkdir()
    (release / "adapter_model.safetensors").write_bytes(b"x")
    lora = release / "adapter-f16.gguf"
    config = Config()
    config.night.export_mode = "adapter"
    assert live_adapter(config, lora) == release
    assert live_adapter(config, None) is None  # the base serves: a fresh LoRA
    config.night.export_mode = "merged"
    assert live_adapter(config, lora) is None


async def test_an_adapter_release_is_continued_on_the_checkpoint_it_was_trained_on(tmp_path):
    """After a merged release, an adapter night trains on that merged checkpoint; the night
    after it must continue the adapter there, not on the configured base."""
    from core.config import Config
    from core.storage.store import Store

    config = Config()
    config.paths.data_dir = tmp_path
    store = await Store.open(tmp_path / "store.db")
    try:
        merged = tmp_path / "releases" / "night-0001" / "merged"
        meta = {"gguf": str(tmp_path / "night-0001.gguf"), "lora": str(tmp_path / "a.gguf"),
                "merged_dir": None, "hf_base": str(merged)}
        release = await store.add_release("night-0002", str(tmp_path / "night-0002"), meta)
        await store.set_release_state(release, "live")
        gguf, lora, base_dir, live = await live_model(config, store)
        assert (gguf.name, lora.name, base_dir, live) == ("night-0001.gguf", "a.gguf", merged, release)
    finally:
        await store.close()
