"""The night as one resumable job: ``python -m trainer sleep [--job N]``.

    queued -> judging -> gating (the live side) -> training -> exporting -> gating
           -> awaiting_promotion | done                  (failed, cancelled at any point)

The job's row in the store is the only link to the bot: the bot creates it
(``!sleep``), starts this process, watches the state, and swaps the served
model when a candidate is promoted (automatically or by ``/promote``). This
process never touches the bot's server except to ask the live model to judge.

Resuming (``--job N`` again after a crash): part 1 resumes from the store's
night ledger; the live side measured for the gate, a finished adapter, a verified
release and a saved gate report are each kept, and only the missing stages run.

The value memory learns the night's sub-tasks only after training succeeded
(``trainer.night.remember``), so a night re-run after a failed training
predicts from the same memory as its first run.

What the night report (``bot.night.report``) reads is kept in the job's progress as
the stages go: the counts (eligible, excluded per reason), the rewards by source and
the judge's agreement, every training step's loss parts and log-ratios
(``train_history``), and the gate's report with its per-family scores.

Budget: the night answers the gate's live side before it trains, so the training gets
what ``night.budget_s`` leaves once the export and the candidate's side are reserved
(``trainer.budget.reserved``); a night that would run past it trains fewer steps and
says so (``trained.budget_note``, in the report), from an earlier tokens/s and its own.

Forgetting (``trainer.forgets``): right before training the night drops the rows of
episodes forgotten since it collected them, and it refuses its own release when one it
trained on is forgotten later. It holds the value memory's lock while the memory is
open, and purges the memories of forgotten episodes when it opens it, when it adds to
it and before it lets it go (``core.storage.copies``).

Cancellation: ``/wake`` marks the job cancelled (and sends SIGTERM); the job
checks its state between stages and between training steps.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import traceback
from contextlib import ExitStack
from pathlib import Path

from core.config import Config
from core.model.chat_format import resolve_async
from core.storage.copies import holding_value_memory
from core.storage.embedder import MiniLMEmbedder
from core.storage.store import Store
from trainer.budget import reserved, resumed_clock
from trainer.client import JsonClient
from trainer.converter import fetch_converter
from trainer.export import ReleaseError, export_release, serve_paths, verify_release
from trainer.forgets import ForgottenAfterTraining, drop_forgotten, refuse_if_forgotten
from trainer.gate import run_gate
from trainer.gate_side import Side, measure_model, pin_view
from trainer.live import live_adapter, live_model
from trainer.margins import summary
from trainer.night import NightResult, night_dir, remember, run_part1
from trainer.value import ValueMemory


GROUPS_KEPT = 200  # mixed practice groups kept in the job's progress (the summary has all)
HISTORY_KEYS = ("step", "lr", "oapl", "echo", "imitation", "total", "logratio_pos", "logratio_neg",
                "seconds")


def _rounded(value: object, significant: int | None = None) -> object:
    """Six decimals, or ``significant`` digits (a learning rate is 1e-3 or smaller)."""
    if not isinstance(value, float):
        return value
    return float(f"{value:.{significant}g}") if significant else round(value, 6)


class Cancelled(Exception):
    """The job was cancelled (``/wake``)."""


class Night:
    """One night job: its store row, its directory, and its stages."""

    def __init__(self, config: Config, store: Store, job_id: int) -> None:
        self.config, self.store, self.job_id = config, store, job_id
        self.dir = night_dir(config, job_id)
        self.progress: dict = {}
        self.part1: NightResult | None = None
        self._memory: ValueMemory | None = None
        self._held = ExitStack()  # the value memory's lock, while the memory is open
        self.args: dict = {}  # the job's inputs (since, agent_view, heldout)

    async def set(self, state: str | None = None, **progress) -> None:
        now = time.time()
        self.progress.update(progress, updated=now)
        if state:
            self._time_stage(state, now)
            self.progress["stage"] = state
        await self.store.update_job(self.job_id, state=state, progress=self.progress)

    def _time_stage(self, state: str, now: float) -> None:
        """Seconds per stage (``stage_seconds``): the next night's budget reads the
        export's."""
        stage, entered = self.progress.get("stage"), self.progress.get("stage_entered")
        if stage and entered and stage != state:
            seconds = self.progress.setdefault("stage_seconds", {})
            seconds[stage] = round(seconds.get(stage, 0.0) + now - entered, 1)
        if stage != state:
            self.progress["stage_entered"] = now

    async def training_budget(self) -> tuple[float | None, float | None]:
        """(seconds the training may take, an earlier night's training tokens/s): the
        night's ``budget_s`` less what it has spent and what the export and the gate's
        candidate side will take (``trainer.budget.reserved``)."""
        budget = self.config.night.budget_s
        if not budget:
            return None, None
        rate, export = None, None
        for job in reversed(await self.store.jobs("sleep")):
            progress = job.get("progress") or {}
            if job["id"] == self.job_id:
                continue
            rate = rate or (progress.get("trained") or {}).get("tokens_per_s")
            export = export or (progress.get("stage_seconds") or {}).get("exporting")
        spent = time.time() - self.progress.get("started_at", time.time())
        left = budget - spent - reserved(budget, self.progress.get("gate_before_s"), export)
        return max(0.0, left), rate

    async def check(self) -> None:
        job = await self.store.job(self.job_id)
        if job is None or job["state"] == "cancelled":
            raise Cancelled()

    # -- stages ------------------------------------------------------------------------

    def memory(self) -> ValueMemory:
        if self._memory is None:  # one embedder load per night
            self._held.enter_context(holding_value_memory(self.config.data_dir))
            self._memory = ValueMemory(self.config.data_dir / "value-memory", MiniLMEmbedder())
        return self._memory

    async def purge_memory(self) -> None:
        """Delete the memories of every forgotten episode (one forgotten while no night
        held the memory was purged by /forget; this catches the others)."""
        forgotten = await self.store.forgotten_episodes()
        if forgotten:
            await asyncio.to_thread(self.memory().forget, forgotten)

    async def close(self) -> None:
        """Purge the memory once more and let it go: a forget made while this night held
        it is honoured before another process may open it."""
        try:
            if self._memory is not None:
                await self.purge_memory()
        except Exception as exc:  # noqa: BLE001 - the night's outcome stands; said in its row
            await self.set(memory_purge_error=f"{type(exc).__name__}: {exc}")
        finally:
            self._held.close()

    async def judge(self) -> Path:
        await self.set("judging")
        await self.purge_memory()
        until = self.progress.setdefault("collected_until", time.time())
        client = JsonClient.for_config(self.config)
        try:
            result = await run_part1(self.config, self.store, self.job_id, client, self.memory(),
                                     self.progress.get("since"), until,
                                     progress=lambda stage, info: None,
                                     release=self.progress.get("base_release"))
        finally:
            await client.close()
        self.part1 = result
        await self.set(counts=dict(result.counts), timings=result.timings,
                       judge_agreement=result.agreement, rewards=result.rewards,
                       labellers=result.labellers)
        return result.dataset

    async def remember(self) -> None:
        """The value memory's one update of this night, after training succeeded."""
        if self.part1 is None or self.progress.get("remembered"):
            return
        forgotten = await self.store.forgotten_among(
            {i for s in self.part1.subtasks for i in s.episodes})
        await asyncio.to_thread(remember, self.memory(), self.part1,
                                self.progress["collected_until"], forgotten)
        await self.purge_memory()
        await self.set(remembered=True)

    async def honour_forgets(self, dataset: Path) -> None:
        """Right before training: the rows of episodes forgotten since collect are dropped,
        and what it trains on is kept (``trained_episodes``) for the release to carry."""
        kept, forgotten, dropped = await drop_forgotten(self.store, dataset)
        if forgotten:
            await self.set(dropped_forgotten={"episodes": sorted(forgotten), "rows": dropped})
        adapter = self.dir / "adapter" / "adapter_model.safetensors"
        if not ("trained" in self.progress and adapter.is_file()):  # not a finished training
            await self.set(trained_episodes=sorted(kept))

    async def refuse_if_forgotten(self, when: str) -> None:
        """Once trained: an episode it trained on and forgotten since refuses the release."""
        await refuse_if_forgotten(self.store, self.progress.get("trained_episodes") or [], when)

    async def train(self, dataset: Path, base_dir: Path, start_adapter: Path | None = None) -> dict:
        """Train the night's LoRA on ``base_dir``; in adapter mode ``start_adapter`` is the live
        release's adapter, continued (its model is pi_lag), so nights chain."""
        adapter = self.dir / "adapter"
        if (adapter / "adapter_model.safetensors").is_file() and "trained" in self.progress:
            return self.progress["trained"]
        await self.set("training", train_history=[])  # a resumed training starts over
        from trainer.settings import Settings
        from trainer.train import train
        from trainer.train_cli import read_rows

        budget, rate = await self.training_budget()
        settings = Settings.of(self.config, base_dir, progress=False,
                               start_adapter=str(start_adapter) if start_adapter else None,
                               time_budget_s=budget, expected_tokens_per_s=rate,
                               chat_format=(await resolve_async(self.config)).name)
        loop = asyncio.get_running_loop()
        rows = read_rows(dataset)

        def on_step(event: dict) -> None:
            future = asyncio.run_coroutine_threadsafe(self._training_step(event), loop)
            future.result()  # raises Cancelled inside the training thread

        result = await asyncio.to_thread(train, rows, base_dir, adapter, settings, on_step)
        trained = {"steps": result.steps, "batch": result.batch, "sequences": result.sequences,
                   "tokens": result.tokens, "seconds": round(result.seconds, 1),
                   "planned_steps": result.planned_steps, "compute_dtype": settings.compute_dtype,
                   "tokens_per_s": round(result.tokens_per_s, 1),
                   "budget_s": None if budget is None else round(budget, 1),
                   "budget_note": result.budget_note,
                   "stop_note": result.stop_note, "stop_checks": result.stop_checks}
        # Each mixed practice group: its advantages' spread and what training did to its
        # passing attempts against its failing ones (trainer.margins); the report shows it.
        await self.set(trained=trained, groups=result.groups[:GROUPS_KEPT],
                       groups_summary=summary(result.groups))
        return trained

    async def _training_step(self, event: dict) -> None:
        await self.check()
        keep = ("step", "steps", "lr", "oapl", "echo", "imitation", "total", "tokens_per_s",
                "logratio_pos", "logratio_neg")
        step = {k: event[k] for k in keep if k in event}
        # Every step's loss parts and log-ratios, for the night report's loss plot: a
        # runaway negative log-ratio is the first sign of collapse (DESIGN.md, OAPL). Its
        # seconds show what the budget's estimate saw (the first pass also pays for pi_lag).
        history = self.progress.setdefault("train_history", [])
        history.append({k: _rounded(event.get(k), 4 if k == "lr" else None) for k in HISTORY_KEYS})
        await self.set(train_step=step, train_history=history)

    async def export(self, base_dir: Path, steps: int, base_gguf: Path) -> Path:
        release = self.config.data_dir / "releases" / f"night-{self.job_id:04d}"
        try:
            verify_release(release, base_dir)
            return release
        except ReleaseError:
            pass
        await self.set("exporting")
        converter = await asyncio.to_thread(fetch_converter, self.config.cache_dir)
        await asyncio.to_thread(export_release, self.dir / "adapter", base_dir, release, converter,
                                night=self.job_id, step=steps, mode=self.config.night.export_mode,
                                base_gguf=base_gguf)
        await asyncio.to_thread(verify_release, release, base_dir)
        return release

    async def measure_live(self, dataset: Path, live: tuple[Path, Path | None]) -> None:
        """The gate's first side, before training: what the live model answers to the
        night's items, and how long that took (the candidate's side is reserved from it)."""
        if "gate_before" in self.progress or "gate" in self.progress:
            return
        await self.set("gating")
        start = time.monotonic()
        await self.set(agent_view=await pin_view(self.config, self.store, self.args, self.dir))
        side = await measure_model(self.config, self.store, read_jsonl(dataset),
                                   self.gate_args(), live)
        await self.set(gate_before=side.kept(), gate_before_model=[str(p) for p in live if p],
                       gate_before_s=round(time.monotonic() - start, 1))

    def gate_args(self) -> dict:
        """The job's inputs, with the agent's view both gate sides render with."""
        pinned = self.progress.get("agent_view")
        if not (pinned and Path(pinned).is_file()):
            pinned = self.args.get("agent_view")
        return {**self.args, "agent_view": pinned}

    async def gate(self, dataset: Path, live: tuple[Path, Path | None], release: Path) -> dict:
        """The paired gate (trainer.gate); its outcome and reasons go into the progress.
        The live side measured before training stands if the same model still serves."""
        if "gate" in self.progress:
            return self.progress["gate"]
        await self.set("gating")
        kept = self.progress.get("gate_before")
        same = self.progress.get("gate_before_model") == [str(p) for p in live if p]
        report = await run_gate(self.config, self.store, read_jsonl(dataset), self.gate_args(),
                                live, serve_paths(release), check=self.check,
                                measured=Side(**kept) if kept and same else None)
        await self.set(gate=report.as_dict())
        return self.progress["gate"]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


async def run_night(config: Config, job_id: int | None = None, since: float | None = None) -> int:
    """Run (or resume) one night; returns the job id. Never raises for a failed night:
    the job ends failed with the error, and the live model keeps serving."""
    store = await Store.open(config.store_path)
    try:
        if job_id is None:
            job_id = await store.create_job("sleep", {"requested_by": "cli", "since": since})
        job = await store.job(job_id)
        if job is None:
            raise ValueError(f"no job {job_id}")
        night = Night(config, store, job_id)
        night.args = job["args"]
        night.progress = resumed_clock(dict(job["progress"]), time.time())
        night.progress.setdefault("started_at", time.time())  # the budget counts from here
        since = job["args"].get("since", since)
        # Where the last promoted night's collection ended: unpromoted nights' data is kept.
        night.progress.setdefault("since", await store.next_night_since()
                                  if since is None else since)
        await store.update_job(job_id, state="running", pid=os.getpid(), error="")
        try:
            await _stages(night, config, store)
        except Cancelled:
            await store.update_job(job_id, state="cancelled", error="cancelled by /wake")
        except ForgottenAfterTraining as exc:
            await _refused(night, store, exc)
        except Exception as exc:
            await store.update_job(job_id, state="failed", error=f"{type(exc).__name__}: {exc}\n"
                                   + traceback.format_exc()[-2000:])
        finally:
            await night.close()
        return job_id
    finally:
        await store.close()


async def _stages(night: Night, config: Config, store: Store) -> None:
    await night.check()
    live_gguf, live_lora, base_dir, base_release = await live_model(config, store)
    night.progress.setdefault("base_release", base_release)
    dataset = await night.judge()
    await night.check()
    await night.honour_forgets(dataset)
    await night.measure_live(dataset, (live_gguf, live_lora))
    await night.check()
    trained = await night.train(dataset, base_dir, live_adapter(config, live_lora))
    await night.remember()
    await night.check()
    await night.refuse_if_forgotten("before the export")
    release = await night.export(base_dir, trained["steps"], live_gguf)
    await night.check()
    report = await night.gate(dataset, (live_gguf, live_lora), release)
    await night.refuse_if_forgotten("before its release was recorded")
    gguf, lora = serve_paths(release)
    meta = {"gguf": str(gguf), "lora": str(lora) if lora else None, "night": night.job_id,
            "merged_dir": str(release / "merged") if (release / "merged").is_dir() else None,
            "hf_base": str(base_dir),  # an adapter release's next night continues on it
            "base_release_id": night.progress["base_release"], "gate": report,
            # /promote refuses it if one of them is forgotten later (serving.releases).
            "trained_episodes": night.progress.get("trained_episodes")}
    existing = [r for r in await store.releases() if r["name"] == release.name]
    state = "rejected" if outcome_of(report) == "reject" else "candidate"
    release_id = existing[0]["id"] if existing else await store.add_release(
        release.name, str(release), meta, state)
    await finish(night, store, report, release_id)


async def _refused(night: Night, store: Store, exc: ForgottenAfterTraining) -> None:
    """The night trained on an episode forgotten since: its release (if one was recorded
    already, by a run this one resumed) is rejected, its dataset loses the rows, and the
    job fails saying why. Its episodes stay for the next night (it was not promoted)."""
    name = f"night-{night.job_id:04d}"
    for release in await store.releases():
        if release["name"] == name and release["state"] == "candidate":
            await store.set_release_state(release["id"], "rejected")
    dataset = night.dir / "train.jsonl"
    if dataset.is_file():
        await drop_forgotten(store, dataset)
    await store.update_job(night.job_id, state="failed", error=str(exc))


def outcome_of(report: dict) -> str:
    return report.get("outcome", "promote" if report.get("passed") else "reject")


async def finish(night: Night, store: Store, report: dict, release_id: int) -> None:
    """End the job by the gate's outcome. A rejected release is marked so; an
    inconclusive one stays a candidate that an admin may still promote by hand. Either
    way the night ends ``done`` without consuming its data (``next_night_since``)."""
    outcome = outcome_of(report)
    reason = "; ".join(report.get("reasons", []))
    if outcome == "promote":
        await night.set("awaiting_promotion", release_id=release_id, outcome=outcome,
                        note=f"the candidate passed the gate: {reason}")
        return
    if outcome == "reject":  # already so when it was added; a resumed night makes sure
        await store.set_release_state(release_id, "rejected")
    await night.set("done", release_id=release_id, outcome=outcome,
                    note=f"gate {outcome}: {reason}; this night's episodes stay for the next "
                         "night")
