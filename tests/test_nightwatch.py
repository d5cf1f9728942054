"""The bot's night watch: dead trainers, promotion, single-GPU pauses, progress, /wake."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

from bot import admin
from bot.runtime import Runtime
from core.config import Config
from tests.scripted import ScriptedLLM
from tests.test_channels import FakeServer


class SwappingServer(FakeServer):
    def __init__(self, gguf):
        super().__init__(gguf)
        self.swaps, self.stops, self.starts = [], 0, 0

    async def swap(self, gguf, *, mode="blue-green", reason="", lora=None):
        self.swaps.append((gguf, mode))
        self.gguf = gguf

    async def stop(self):
        self.stops += 1

    async def start(self, **kw):
        self.starts += 1

    async def pause(self):
        self.paused = True
        await self.stop()

    async def resume(self):
        await self.start()
        self.paused = False


async def runtime(tmp_path, **night) -> Runtime:
    config = Config()
    config.paths.data_dir = tmp_path
    for key, value in night.items():
        setattr(config.night, key, value)
    return await Runtime.start(config, supervisor=SwappingServer(tmp_path / "base.gguf"),
                               llm=ScriptedLLM([]), start_server=False)


def fake_trainer(job_id: int) -> subprocess.Popen:
    """A process whose command line is a night's trainer for ``job_id`` (it only sleeps)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                             "-m", "trainer", "sleep", "--job", str(job_id)],
                            start_new_session=True)


def make_release(tmp_path, name="night-0001") -> tuple[str, dict]:
    release = tmp_path / "releases" / name
    release.mkdir(parents=True)
    gguf = release / "model-q8_0.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    files = {"model-q8_0.gguf": hashlib.sha256(gguf.read_bytes()).hexdigest()}
    (release / "release.json").write_text(json.dumps({"files": files,
                                                      "serve": {"gguf": gguf.name}}))
    return str(release), {"gguf": str(gguf)}


async def test_a_night_whose_trainer_died_is_marked_failed_and_resumable(tmp_path):
    rt = await runtime(tmp_path)
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        job = await rt.store.create_job("sleep", {})
        await rt.store.update_job(job, state="training", pid=dead.pid)
        await rt.night.poll()
        got = await rt.store.job(job)
        assert got["state"] == "failed" and f"sleep --job {job}" in got["error"]
    finally:
        await rt.close()


async def test_a_poll_while_a_night_resumes_does_not_fail_it_by_its_dead_pid(tmp_path):
    rt = await runtime(tmp_path)
    started = []
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        job = await rt.store.create_job("sleep", {})
        await rt.store.update_job(job, state="failed", pid=dead.pid, error="died")

        async def launch(job_id):  # the watch polls before the new trainer is named
            await rt.night.poll()
            started.append(fake_trainer(job_id))
            await rt.store.update_job(job_id, pid=started[-1].pid)

        rt.night.launch = launch
        await rt.night.resume(job)
        await rt.night.poll()
        got = await rt.store.job(job)
        assert (got["state"], got["error"], got["pid"]) == ("queued", "", started[0].pid)
    finally:
        for child in started:
            child.kill()
            child.wait()
        await rt.close()


async def test_auto_promote_swaps_in_a_candidate_that_passed_the_gate(tmp_path):
    rt = await runtime(tmp_path, auto_promote=True)
    try:
        path, meta = make_release(tmp_path)
        release = await rt.store.add_release("night-0001", path, meta)
        job = await rt.store.create_job("sleep", {})
        await rt.store.update_job(job, state="awaiting_promotion", progress={"release_id": release})
        await rt.night.poll()
        assert rt.supervisor.swaps == [(tmp_path / "releases/night-0001/model-q8_0.gguf", "blue-green")]
        assert (await rt.store.job(job))["state"] == "live"
        assert [r["state"] for r in await rt.store.releases()] == ["live"]
        assert (await admin.rollback(rt.releases)).startswith("Rolled back to the base model")
        assert [r["state"] for r in await rt.store.releases()] == ["retired"]
    finally:
        await rt.close()


async def test_a_corrupt_release_is_refused_and_never_goes_live(tmp_path):
    rt = await runtime(tmp_path)
    try:
        path, meta = make_release(tmp_path)
        (tmp_path / "releases/night-0001/model-q8_0.gguf").write_bytes(b"GGUF tampered")
        await rt.store.add_release("night-0001", path, meta)
        text = await admin.promote(rt.releases)
        assert "refused" in text and "SHA-256" in text
        assert rt.supervisor.swaps == []
        assert [r["state"] for r in await rt.store.releases()] == ["candidate"]
    finally:
        await rt.close()


async def test_single_gpu_stops_serving_while_training_and_restarts_after(tmp_path):
    rt = await runtime(tmp_path, single_gpu=True)
    try:
        job = await rt.store.create_job("sleep", {})
        sleeper = fake_trainer(job)
        await rt.store.update_job(job, state="training", pid=sleeper.pid)
        await rt.night.poll()
        assert rt.supervisor.stops == 1 and rt.night.server_paused
        await rt.store.update_job(job, state="exporting")
        await rt.night.poll()
        assert rt.supervisor.starts == 1 and not rt.night.server_paused
        sleeper.kill()
        sleeper.wait()
    finally:
        await rt.close()


async def test_progress_reaches_listeners_once_per_change_and_wake_cancels(tmp_path):
    rt = await runtime(tmp_path)
    seen = []

    async def listener(job):
        seen.append(job["state"])

    rt.night.listeners.append(listener)
    try:
        job = await rt.store.create_job("sleep", {})
        sleeper = fake_trainer(job)
        await rt.store.update_job(job, state="judging", pid=sleeper.pid)
        await rt.night.poll()
        await rt.night.poll()
        assert seen.count("judging") == 1 and seen[-1] == "judging"  # once, however often polled
        assert (await admin.wake(rt.store)) == f"Cancelled night job(s) #{job}."
        assert sleeper.wait(timeout=10) != 0  # SIGTERM reached the trainer's process group
        await rt.night.poll()
        assert seen[-1] == "cancelled" and seen.count("cancelled") == 1
    finally:
        await rt.close()
