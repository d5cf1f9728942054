"""bench/learning.py's two measured steps: the held-out items answered by the agent and
checked (with each answer's rounds of tool calls), and the night launched as the bot launches
it, each state it passes through timed."""

from __future__ import annotations

import asyncio
import time

from bot.night.jobs import ACTIVE
from bot.runtime import Runtime
from core.practice.checks import judge
from core.practice.sets import PracticeSet


ANSWER_CHARS = 300  # of each answer kept beside its score, to read what a night taught


async def evaluate(rt: Runtime, pset: PracticeSet, phase: str
                   ) -> tuple[list[float], list[int], list[str]]:
    """Each held-out task answered once by the agent in a fresh channel, and checked: the
    rewards, the rounds of tool calls each answer made, and the answers' first characters."""
    rewards, calls, answers = [], [], []
    for task in pset.tasks:
        channel = f"bench-{phase}-{pset.name}-{task.id}"
        result = await rt.turn(channel, task.prompt, "bench")
        calls.append(result.tool_rounds)
        answers.append((result.reply or "")[:ANSWER_CHARS])
        ctx = rt.spaces.context(channel)
        if not result.ok:
            rewards.append(0.0)
            continue
        verdict = await judge(task, result.reply, ctx.workspace, ctx.services.sandbox,
                              rt.config.practice.check_timeout_s)
        rewards.append(verdict.reward if verdict.judged else 0.0)
    return rewards, calls, answers


async def night(rt: Runtime, since: float, timeout_s: float) -> dict:
    """Launch the night job as the bot does, and time each state it passes through."""
    job_id = await rt.store.create_job("sleep", {"requested_by": "bench/learning.py",
                                                 "channel": "bench", "since": since,
                                                 "requested_at": time.time()})
    started = time.monotonic()
    await rt.night.launch(job_id)
    stages: dict[str, float] = {}
    state, entered = None, started
    while True:
        job = await rt.store.job(job_id)
        now = time.monotonic()
        if job["state"] != state:
            if state is not None:
                stages[state] = stages.get(state, 0.0) + now - entered
            state, entered = job["state"], now
            print(f"  night #{job_id}: {state} at {now - started:.0f} s", flush=True)
        if state not in ACTIVE:
            break
        if now - started > timeout_s:
            await rt.store.update_job(job_id, state="cancelled", error="bench timeout")
            print(f"  night #{job_id}: cancelled after {timeout_s:.0f} s", flush=True)
            job = await rt.store.job(job_id)
            break
        await asyncio.sleep(1.0)
    return {"job": job, "wall_s": time.monotonic() - started, "stages": stages}
