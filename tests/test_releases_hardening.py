"""Issue 11, part 4: releases, nights and admin commands under retries, races and restarts.

Each test here failed on the code before the fix it names.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import time

from bot import admin
from bot.app import console_commands
from bot.console import ConsoleRenderer, run_console
from bot.night.jobs import is_trainer
from serving.kinds import ServerStartError
from tests.scripted import ScriptedLLM, say
from tests.test_nightwatch import fake_trainer, make_release, runtime


class FailingSwaps:
    """Makes every swap of ``rt.supervisor`` fail like a canary that never passes."""

    def __init__(self, rt) -> None:
        self.tries = 0
        rt.supervisor.swap = self.swap

    async def swap(self, gguf, *, mode="blue-green", reason="", lora=None):
        self.tries += 1
        raise ServerStartError("canary failed")


async def add_candidate(rt, tmp_path, name: str) -> int:
    path, meta = make_release(tmp_path, name)
    return await rt.store.add_release(name, path, meta)


async def test_auto_promote_tries_a_failing_candidate_once_not_every_poll(tmp_path):
    rt = await runtime(tmp_path, auto_promote=True)
    try:
        swaps = FailingSwaps(rt)
        release = await add_candidate(rt, tmp_path, "night-0001")
        job = await rt.store.create_job("sleep", {})
        await rt.store.update_job(job, state="awaiting_promotion", progress={"release_id": release})
        for _ in range(4):
            await rt.night.poll()
        assert swaps.tries == 1
        got = await rt.store.job(job)
        assert got["state"] == "awaiting_promotion"
        assert "failed to start" in got["progress"]["promotion"]
        assert [r["state"] for r in await rt.store.releases()] == ["candidate"]
    finally:
        await rt.close()


async def test_auto_promote_never_promotes_another_nights_candidate(tmp_path):
    rt = await runtime(tmp_path, auto_promote=True)
    try:
        await add_candidate(rt, tmp_path, "night-0001")  # waiting for a manual /promote
        job = await rt.store.create_job("sleep", {})
        await rt.store.update_job(job, state="awaiting_promotion", progress={})  # no release
        await rt.night.poll()
        await rt.night.poll()
        assert rt.supervisor.swaps == []
        assert [r["state"] for r in await rt.store.releases()] == ["candidate"]
        assert "nothing promoted" in (await rt.store.job(job))["progress"]["promotion"]
    finally:
        await rt.close()


async def test_a_candidate_whose_stored_gate_rejected_it_is_never_promoted(tmp_path):
    """A crash between add_release and marking it rejected left a gate-failed candidate
    that /promote served (issue 40). The decision is stored with the release, and read."""
    rt = await runtime(tmp_path)
    try:
        path, meta = make_release(tmp_path, "night-0001")
        failed = {"outcome": "reject", "reasons": ["held-out items fell"]}
        crashed = await rt.store.add_release("night-0001", path, {**meta, "gate": failed})
        text = await admin.promote(rt.releases)
        assert text.startswith(f"Release #{crashed} failed its gate (held-out items fell)")
        assert rt.supervisor.swaps == [] and await admin.promote(rt.releases, crashed) == text
        path, meta = make_release(tmp_path, "night-0002")
        stored = await rt.store.add_release("night-0002", path, {**meta, "gate": failed},
                                            "rejected")
        assert [r["state"] for r in await rt.store.releases()] == ["candidate", "rejected"]
        assert (await admin.promote(rt.releases, stored)).endswith("is not a candidate.")
    finally:
        await rt.close()


async def test_a_second_rollback_goes_further_back_never_forward(tmp_path):
    rt = await runtime(tmp_path)
    try:
        first = await add_candidate(rt, tmp_path, "night-0001")
        second = await add_candidate(rt, tmp_path, "night-0002")
        assert (await admin.promote(rt.releases, first)).startswith(
            f"Now serving release #{first}")
        assert (await admin.promote(rt.releases, second)).startswith(
            f"Now serving release #{second}")
        assert (await admin.rollback(rt.releases)).startswith(f"Now serving release #{first}")
        text = await admin.rollback(rt.releases)  # before the fix: release #2 again
        assert text.startswith("Rolled back to the base model"), text
        assert [r["state"] for r in await rt.store.releases()] == ["retired", "retired"]
        assert (await admin.rollback(rt.releases)).startswith("The base model is already serving")
        served = [gguf.parent.name if gguf.parent.name.startswith("night") else gguf.name
                  for gguf, _ in rt.supervisor.swaps]
        assert served == ["night-0001", "night-0002", "night-0001", rt.config.served_gguf.name]
    finally:
        await rt.close()


async def test_rollback_never_serves_again_a_release_trained_on_a_forgotten_episode(tmp_path):
    rt = await runtime(tmp_path)
    try:
        episode = await rt.store.start_episode("c")
        await rt.store.end_episode(episode, "complete")
        path, meta = make_release(tmp_path, "night-0001")
        tainted = await rt.store.add_release("night-0001", path,
                                             {**meta, "trained_episodes": [episode]})
        clean = await add_candidate(rt, tmp_path, "night-0002")
        await admin.promote(rt.releases, tainted)
        await admin.promote(rt.releases, clean)
        await rt.store.forget_episode(episode)
        assert (await admin.rollback(rt.releases, tainted)) == (
            f"Release #{tainted} refused: its night trained on episode(s) #{episode}, "
            "forgotten since. Nothing changed.")
        text = await admin.rollback(rt.releases)
        assert text.startswith("Rolled back to the base model"), text
        assert f"skipped release(s) #{tainted}: trained on an episode forgotten since" in text
        served = [gguf.parent.name if gguf.parent.name.startswith("night") else gguf.name
                  for gguf, _ in rt.supervisor.swaps]
        assert served == ["night-0001", "night-0002", rt.config.served_gguf.name]
    finally:
        await rt.close()


async def test_two_sleeps_at_once_start_one_night(tmp_path):
    rt = await runtime(tmp_path)
    launched = []

    async def launch(job_id):
        launched.append(job_id)

    rt.night.launch = launch
    try:
        answers = await asyncio.gather(*(admin.sleep(rt.store, rt.night, rt.agent, "alice", "c1")
                                         for _ in range(4)))
        assert len(await rt.store.jobs("sleep")) == 1 and launched == [1]
        assert sum(a.startswith("Going to sleep") for a in answers) == 1
        assert sum(a.startswith("A night is already queued (job #1)") for a in answers) == 3
    finally:
        await rt.close()


def stranger() -> subprocess.Popen:
    """Some other program that got a dead trainer's pid after a restart."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            start_new_session=True)


async def test_wake_never_signals_a_reused_pid(tmp_path):
    rt = await runtime(tmp_path)
    other = stranger()
    other_night = fake_trainer(99)  # the trainer of another job
    try:
        job = await rt.store.create_job("sleep", {})
        await rt.store.update_job(job, state="training", pid=other.pid)
        second = await rt.store.create_job("sleep", {})
        await rt.store.update_job(second, state="queued", pid=other_night.pid)
        assert (await admin.wake(rt.store)) == f"Cancelled night job(s) #{job}, #{second}."
        await asyncio.sleep(0.3)
        assert other.poll() is None and other_night.poll() is None  # both untouched
    finally:
        for proc in (other, other_night):
            proc.kill()
            proc.wait()
        await rt.close()


async def test_a_job_whose_pid_was_reused_is_marked_failed(tmp_path):
    rt = await runtime(tmp_path)
    other = stranger()
    try:
        job = await rt.store.create_job("sleep", {})
        await rt.store.update_job(job, state="judging", pid=other.pid)
        await rt.night.poll()
        assert (await rt.store.job(job))["state"] == "failed"
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
        await rt.close()


async def test_wake_stops_this_nights_trainer(tmp_path):
    rt = await runtime(tmp_path)
    try:
        job = await rt.store.create_job("sleep", {})
        trainer = fake_trainer(job)
        await rt.store.update_job(job, state="training", pid=trainer.pid)
        await asyncio.sleep(0.2)  # until its command line is the trainer's
        await admin.wake(rt.store)
        assert trainer.wait(timeout=10) == -15
    finally:
        await rt.close()


class BlockingLLM(ScriptedLLM):
    def __init__(self) -> None:
        super().__init__([say("done")])
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def chat(self, messages, **kwargs):
        self.entered.set()
        await self.release.wait()
        return await super().chat(messages, **kwargs)


async def test_sys_reset_waits_for_the_channels_turn(tmp_path):
    rt = await runtime(tmp_path)
    llm = rt.agent.llm = BlockingLLM()
    try:
        turn = asyncio.create_task(rt.turn("c1", "hello"))
        await asyncio.wait_for(llm.entered.wait(), 10)
        reset = asyncio.create_task(admin.sys_reset(rt.workers, rt.spaces, "c1"))
        await asyncio.sleep(0.2)
        assert not reset.done()  # the turn holds the channel (its journal)
        llm.release.set()
        await asyncio.wait_for(turn, 10)
        assert (await asyncio.wait_for(reset, 10)).startswith("This channel's editable")
        llm.release.clear()
        llm.script.append(say("done again"))
        turn = asyncio.create_task(rt.turn("c1", "a long one"))
        llm.entered.clear()
        await asyncio.wait_for(llm.entered.wait(), 10)
        # never hangs on a long turn
        busy = await admin.sys_reset(rt.workers, rt.spaces, "c1", wait_s=0.2)
        assert busy.startswith("This channel is in the middle of a turn")
        llm.release.set()
        await asyncio.wait_for(turn, 10)
    finally:
        await rt.close()


async def test_a_console_admin_command_that_raises_does_not_stop_the_console(tmp_path):
    rt = await runtime(tmp_path)

    async def broken(reason):
        raise OSError("no GPU left")

    rt.supervisor.restart = broken
    out, err = io.StringIO(), io.StringIO()
    turns = []

    async def turn(channel, text):
        turns.append(text)
        return "ok"

    try:
        stdin = io.StringIO("/restart-server\n#general still here\n")
        await run_console(turn, console_commands(rt), ConsoleRenderer(out, err), stdin)
        assert "restart-server failed: no GPU left" in out.getvalue()  # a command's answer
        assert turns == ["still here"]
    finally:
        await rt.close()


def test_only_a_live_trainer_of_that_job_counts():
    assert not is_trainer(os.getpid(), 1)  # pytest is alive, but no trainer
    proc = fake_trainer(5)
    try:
        for _ in range(100):  # until the child has exec'd into its command line
            if is_trainer(proc.pid, 5):
                break
            time.sleep(0.05)
        assert is_trainer(proc.pid, 5) and not is_trainer(proc.pid, 6)
    finally:
        proc.kill()
        proc.wait()
    assert not is_trainer(proc.pid, 5)


async def test_a_release_that_hashes_nothing_or_a_changed_base_is_never_served(tmp_path):
    """The release check hashed only what release.json listed (an empty list passed) and
    never an adapter's base GGUF (issue 40)."""
    import hashlib
    import json

    from serving.releases import release_problem

    folder = tmp_path / "releases" / "night-0001"
    folder.mkdir(parents=True)
    (folder / "release.json").write_text(json.dumps({"files": {}, "serve": {"gguf": "m.gguf"}}))
    assert "does not hash the model file it serves (m.gguf)" in release_problem(
        {"path": str(folder)})
    base = tmp_path / "base.gguf"
    base.write_bytes(b"GGUF base")
    lora = folder / "adapter-f16.gguf"
    lora.write_bytes(b"GGUF lora")
    meta = {"mode": "adapter", "serve": {"gguf": str(base), "lora": lora.name},
            "files": {lora.name: hashlib.sha256(lora.read_bytes()).hexdigest()},
            "base_gguf_sha256": hashlib.sha256(base.read_bytes()).hexdigest()}
    (folder / "release.json").write_text(json.dumps(meta))
    assert release_problem({"path": str(folder)}) is None
    base.write_bytes(b"GGUF another base")
    assert "not the one the adapter was exported for" in release_problem({"path": str(folder)})
