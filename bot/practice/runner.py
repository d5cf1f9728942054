"""``/practice FILE [--samples G]``: a day of practice on a set, judged by its checks.

Each practised task (the held-out ones never are) is attempted G times, each
attempt in a fresh channel ``practice-<set>-<task>-<run>-<k>`` (so no attempt
sees another's history or workspace), through the real agent and tools, at
``practice.temperature``: the G samples must differ for their comparison to
teach anything. A task whose G attempts scored differently (some passed, some did not,
or a check's partial credit told them apart) is given more, numbered on from G, up to
``practice.mixed_samples`` in all: only such a group teaches the group-relative loss
anything, and more of its attempts give it a steadier baseline and more passing
attempts to learn from; a task whose attempts all scored alike costs no more. The
agent is the day's own agent class (``PracticeServices.agent``) on the same server,
store, tools and channel spaces; only its temperature differs.

Each attempt's verdict is stored as a channel event on its episode, which is
how the night reads it:

- ``verifier_reward``: ``{"reward", "check", "task", "task_id", "set",
  "group"}`` (the contract of ``trainer/rewards.py``); ``group`` is
  ``"<set>:<task id>:<run>"``: the attempts of one task in one run, whose
  mean reward is their baseline (README, "How it learns");
- the same event with ``"reward": None`` and ``"error"`` (and ``"why"``) when
  the check crashed, timed out or returned garbage, or the turn hit a harness
  error: unjudged, and the night excludes the episode.

A turn stopped by a limit (steps, malformed calls) has no final answer: it is
judged 0, a failure to learn from, not excluded.

When none of the first G judged attempts of a task passed, its reference answer
(``Task.reference``), once the task's check passes it, is recorded as one more episode
of the group in a fresh channel ``...-reference``: the agent's own context, the
reference as its answer (``bot.practice.demonstration``), and a ``verifier_reward`` of 1 with check
``reference``. A reference that shows tool calls has them run there first, and the
check judges what they did. A group that only failed would otherwise teach nothing relative.

The run is a job row (kind ``practice``) whose progress holds tasks done /
total and the mean reward so far; each task's end is also sent to the
practice listeners (the console prints them). Its args hold the
set's resolved path and held-out ids: the gate finds the sets practised there
and reads their held-out items with ``core.practice.sets.held_out_items``.

The command waits for the whole run (on Discord, within the 15 minutes a
deferred answer may take; the job row keeps the progress past that).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from bot.agent.loop import Agent, TurnResult
from bot.channels import ChannelWorkers
from bot.practice.demonstration import demonstrate, run_calls
from bot.practice.services import PracticeServices
from core.practice.checks import Verdict, judge
from core.practice.sets import PracticeSet, Task, load_set
from core.storage.events import REFERENCE, CheckResult, Event

logger = logging.getLogger("nightshift.practice")
MAX_SAMPLES = 64
STOPPED = "stopped by a limit before a final answer"


@dataclass
class _Tally:
    """A run's counts, for progress lines and the job row."""

    tasks: int
    done: int = 0
    rewards: list[float] = field(default_factory=list)
    stopped: int = 0  # judged 0 because the turn hit a limit
    demonstrated: int = 0  # tasks no attempt passed, given their reference as an example
    topped_up: int = 0  # tasks whose first attempts disagreed, given more (mixed_samples)
    unjudged: dict[str, int] = field(default_factory=dict)  # why -> count

    @property
    def mean(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    def line(self, run: int) -> str:
        mean = "n/a" if self.mean is None else f"{self.mean:.2f}"
        skipped = sum(self.unjudged.values())
        return (f"practice #{run}: {self.done}/{self.tasks} tasks, mean reward {mean} over "
                f"{len(self.rewards)} judged attempts ({self.stopped} stopped by a limit)"
                + (f", {skipped} unjudged" if skipped else "")
                + (f", {self.demonstrated} shown by example" if self.demonstrated else "")
                + (f", {self.topped_up} mixed given more attempts" if self.topped_up else ""))

    def progress(self) -> dict:
        return {"tasks_done": self.done, "tasks": self.tasks, "judged": len(self.rewards),
                "stopped": self.stopped, "unjudged": sum(self.unjudged.values()),
                "demonstrated": self.demonstrated, "topped_up": self.topped_up,
                "mean_reward": self.mean}


def publish_held_out(folder: Path, name: str, held: list[Task]) -> Path:
    """Write a set's held-out tasks where the night's gate reads them
    (``<data_dir>/heldout/<set>.jsonl``, one ``{"id", "prompt", "check"}`` per line).
    A python check travels with its code: the gate runs it in the sandbox
    (``trainer.gate_checks``), on the answer alone, in an empty workspace."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": t.id, "prompt": t.prompt, "check": _gate_check(t)})
             for t in held]
    path = folder / f"{name}.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)
    return path


def _gate_check(task: Task) -> dict:
    if task.check.kind == "regex":  # practice matches the whole answer; the gate searches
        return {"regex": rf"\A\s*(?:{task.check.value})\s*\Z"}
    if task.check.kind == "python":
        return {"python": Path(task.check.value).name, "code": task.check.code}
    return {"exact": task.check.value}


async def run_practice(services: PracticeServices, path: str | Path,
                       samples: int | None = None) -> str:
    """Practise the set at ``path``; returns the summary to show. Raises ValueError
    (a PracticeSetError naming the line) for a bad file or a bad sample count."""
    samples = services.config.practice.samples if samples is None else samples
    if not 1 <= samples <= MAX_SAMPLES:
        raise ValueError(f"--samples must be between 1 and {MAX_SAMPLES}, not {samples}")
    more = services.config.practice.mixed_samples
    pset = await asyncio.to_thread(load_set, Path(path).expanduser())
    practised, held = pset.split(services.config.practice.held_out_percent)
    if not practised:
        raise ValueError(f"every task of {pset.path} is held out; add tasks to practise")
    await asyncio.to_thread(publish_held_out, services.config.data_dir / "heldout", pset.name,
                            held)
    run = await services.store.create_job("practice", {
        "path": str(pset.path.resolve()), "set": pset.name, "samples": samples,
        "mixed_samples": more, "practised": len(practised), "held_out": [t.id for t in held]})
    tally = _Tally(len(practised))
    await services.store.update_job(run, state="running", progress=tally.progress())
    agent = services.agent(services.config.practice.max_steps)
    workers = ChannelWorkers(agent.turn, queue_size=samples)
    state = "failed"
    services.rounds.add(f"practice #{run}")  # a due night waits for the run to end
    try:
        for task in practised:
            first = await _attempts(services, workers, pset, task, run, range(samples))
            verdicts = list(first)
            if _mixed(first) and more > samples:
                verdicts += await _attempts(services, workers, pset, task, run,
                                            range(samples, more))
                tally.topped_up += 1
            # The first attempts decide the example: more attempts never take a reference
            # away from a task, nor give one.
            judged = [v for v in first if v.judged]  # none judged: nothing was tried
            failed = judged and all(v.reward < 1 for v in judged)
            if services.config.practice.demonstrate and failed:
                tally.demonstrated += await _demonstrate(services, agent, pset, task, run)
            for verdict in verdicts:
                _count(tally, verdict)
            tally.done += 1
            await services.store.update_job(run, progress=tally.progress())
            await _tell(services, tally.line(run))
        state = "done"
    except asyncio.CancelledError:
        state = "cancelled"
        raise
    finally:
        services.rounds.discard(f"practice #{run}")
        await workers.close()
        await services.store.update_job(run, state=state)
    summary = _summary(run, pset, tally, samples, len(held), more)
    short = gate_shortfall(services.config.data_dir / "heldout",
                           services.config.night.gate_min_items)
    return summary + (f"\n{short}" if short else "")


def gate_shortfall(folder: Path, needed: int) -> str:
    """What to do when all the sets together hold out fewer items than the gate needs
    to decide (``night.gate_min_items``), or "" when they hold enough."""
    held = sum(1 for path in folder.glob("*.jsonl")
               for line in path.read_text().splitlines() if line.strip())
    if held >= needed:
        return ""
    return (f"The gate needs at least {needed} held-out items to decide and the practice sets "
            f"hold out {held}: it needs {needed - held} more (add tasks to the sets, or raise "
            "practice.held_out_percent). Until then the night's gate is inconclusive.")


async def _attempts(services: PracticeServices, workers: ChannelWorkers, pset: PracticeSet,
                    task: Task, run: int, ks: range) -> list[Verdict]:
    return list(await asyncio.gather(*(
        _attempt(services, workers, pset, task, run, k) for k in ks)))


def _mixed(verdicts: list[Verdict]) -> bool:
    """Whether the judged attempts disagree: the group-relative loss learns only from such a
    group, and from more of its attempts the better (``practice.mixed_samples``)."""
    return len({v.reward for v in verdicts if v.judged}) > 1


async def _attempt(services: PracticeServices, workers: ChannelWorkers, pset: PracticeSet,
                   task: Task, run: int, k: int) -> Verdict:
    """One attempt at ``task``: a turn in a fresh channel, its check, its event."""
    channel = f"practice-{pset.name}-{task.id}-{run}-{k}"
    group = f"{pset.name}:{task.id}:{run}"
    try:
        result = await workers.submit(channel, task.prompt, "practice")
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a harness bug in this turn: the attempt cannot be judged
        logger.exception("practice attempt %s failed", channel)
        verdict, episode = Verdict(None, f"the turn failed: {exc}"), None
    else:
        episode = result.episode_id
        verdict = await attempt_verdict(services, channel, task, result)
    # The night's contract (core.storage.events): reward None = unjudged.
    checked = CheckResult(task.check.kind, verdict.reward if verdict.judged else None, task.id,
                          group, "" if verdict.judged else verdict.why, {"set": pset.name})
    await services.store.add_event(channel, episode, Event.VERIFIER_REWARD, checked.payload())
    await services.retire(channel)  # judged: its workspace may be reclaimed
    return verdict


async def _demonstrate(services: PracticeServices, agent: Agent, pset: PracticeSet, task: Task,
                       run: int) -> bool:
    """No attempt passed: add the task's reference to its group, as a turn of the agent's
    own with the check's reward, if the check passes it. A reference with tool calls
    has them run first, in the demonstration's own workspace, and is judged on what
    they did (a python check that wants files does not pass a bare answer)."""
    if not task.reference:
        return False
    channel = f"practice-{pset.name}-{task.id}-{run}-reference"
    try:
        return await _show_reference(services, agent, pset, task, run, channel)
    finally:
        await services.retire(channel)  # shown or not, its workspace may be reclaimed


async def _show_reference(services: PracticeServices, agent: Agent, pset: PracticeSet,
                          task: Task, run: int, channel: str) -> bool:
    ctx = services.context(channel)
    shown = await run_calls(agent, ctx, task.calls) if task.calls else []
    if isinstance(shown, str):
        logger.warning("the reference of %s cannot be shown: %s", task.id, shown)
        return False
    verdict = await judge(task, task.reference, ctx.workspace, ctx.services.sandbox,
                          services.config.practice.check_timeout_s)
    if verdict.reward != 1.0:
        logger.warning("the reference of %s fails its own check: %s", task.id, verdict.why)
        return False
    episode = await demonstrate(agent, channel, task.prompt, task.reference, "practice", shown)
    shown_result = CheckResult(REFERENCE, 1.0, task.id, f"{pset.name}:{task.id}:{run}",
                               extra={"set": pset.name, "demonstration": True})
    await services.store.add_event(channel, episode, Event.VERIFIER_REWARD, shown_result.payload())
    return True


async def attempt_verdict(services: PracticeServices, channel: str, task: Task,
                          result: TurnResult) -> Verdict:
    """An attempt's verdict: its check on a final answer; 0 for a turn stopped by a limit;
    unjudged for a harness or server error (self-play's solvers use it too)."""
    if not result.ok:
        status = await services.store.episode_status(result.episode_id) or "errored"
        if status != "aborted":  # a server or harness error says nothing about the model
            return Verdict(None, f"the turn ended {status}: {result.reply[:200]}")
        return Verdict(0.0, STOPPED)  # no final answer: a failure, not an unknown
    ctx = services.context(channel)
    return await judge(task, result.reply, ctx.workspace, ctx.services.sandbox,
                       services.config.practice.check_timeout_s)


def _count(tally: _Tally, verdict: Verdict) -> None:
    if verdict.judged:
        tally.rewards.append(verdict.reward)
        tally.stopped += verdict.why == STOPPED
    else:
        tally.unjudged[verdict.why] = tally.unjudged.get(verdict.why, 0) + 1


async def _tell(services: PracticeServices, line: str) -> None:
    logger.info("%s", line)
    for listener in list(services.listeners):
        try:
            await listener(line)
        except Exception:  # a broken listener must not stop the practice
            logger.exception("practice listener failed")


def _summary(run: int, pset: PracticeSet, tally: _Tally, samples: int, held: int,
             more: int) -> str:
    mean = "n/a" if tally.mean is None else f"{tally.mean:.2f}"
    lines = [f"Practice #{run} on {pset.name}: {tally.tasks} tasks x {samples} samples "
             f"({held} held out for the gate, never practised).",
             f"Mean reward {mean} over {len(tally.rewards)} judged attempts "
             f"({tally.stopped} stopped by a limit before a final answer); "
             f"{sum(tally.unjudged.values())} unjudged (excluded from training)."]
    for why, count in sorted(tally.unjudged.items(), key=lambda kv: -kv[1])[:3]:
        lines.append(f"  unjudged x{count}: {why}")
    if tally.topped_up:
        lines.append(f"{tally.topped_up} tasks whose first attempts disagreed got {more} in all "
                     "(practice.mixed_samples).")
    if tally.demonstrated:
        lines.append(f"{tally.demonstrated} tasks no attempt passed got their reference answer "
                     "as an example (practice.demonstrate).")
    lines.append("The next night trains on these attempts with the checks' rewards.")
    return "\n".join(lines)
