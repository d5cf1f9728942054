"""The night report: what a night did, told from its job row, with its plots.

The trainer (``trainer.sleep``) writes everything the report needs into the
night job's progress as it goes:

- ``counts``: ``episodes_total``, ``eligible`` (also ``episodes``), and
  ``excluded:REASON`` per reason;
- ``rewards``: per source (verifier, person, judge), ``{n, mean, spread}``;
- ``judge_agreement``: the blind judge against people's labels and against
  checks, each ``{n, agree, percent, uncovered}``;
- ``labellers``: per label giver, the episodes their labels decided and those set
  aside past ``night.labels_per_person`` (``trainer.labellers``);
- ``trained`` (steps, sequences, tokens, seconds) and ``train_history``: per
  step, the loss parts (``oapl``, ``echo``, ``total``) and the mean
  log-ratios of positive and negative messages;
- ``groups_summary`` and ``groups``: per practice group with mixed rewards, the
  spread of its advantages and the change in log-prob of its passing attempts
  against its failing ones after training (``trainer.margins``); ``trained``'s
  ``budget_note`` when the night's budget cut its steps, ``stop_note`` when its
  held-out practice groups stopped it or rolled it back (``trainer.stopping``);
- ``gate``: the outcome and its reasons, the paired gain and interval,
  open chat before/after, and ``families``: per practice family,
  ``{n, before, after}``; ``release_id`` and ``promotion``.

Nothing is stored twice: a report is rebuilt from the job row whenever it is
asked for (``/report N``), so it reads the same as on its night. The plots
(``bot.night.plots``) are drawn in a thread, off the event loop, into
``<data_dir>/reports/night-NNNN/``.

``NightReports`` listens to the night watch: when a night has finished (its
gate decided and, with auto-promote, its one promotion tried) it builds the
report once (a ``night_report`` event in the store remembers it was sent,
across restarts) and hands it to the front ends' listeners, with the channel
it goes to: ``night.report_channel``, else the channel that asked for the
night, else ``sleep.announce_channel`` ("" is the console).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

from bot.night.plots import SOURCES, plot_series, render
from core.storage.events import Event

if TYPE_CHECKING:
    from core.config import Config
    from core.storage.store import Store

logger = logging.getLogger("nightshift.report")
REPORT_EVENT = Event.NIGHT_REPORT
REPORT_EVENT_CHANNEL = "reports"
FINISHED = ("done", "live", "awaiting_promotion")


@dataclass
class NightReport:
    job_id: int
    text: str
    files: list[Path] = field(default_factory=list)
    channel: str = ""


Listener = Callable[[NightReport], Awaitable[None]]


def finished(job: dict, auto_promote: bool) -> bool:
    """The night's gate decided and, with auto-promote, its one promotion was tried."""
    progress = job.get("progress") or {}
    if job.get("kind", "sleep") != "sleep" or job["state"] not in FINISHED:
        return False
    if "gate" not in progress:
        return False
    waiting = job["state"] == "awaiting_promotion" and auto_promote
    return not waiting or "promotion" in progress


# -- text ---------------------------------------------------------------------------


def _num(value: object, digits: int = 3, sign: bool = False) -> str:
    if not isinstance(value, (int, float)):
        return "n/a"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def data_lines(progress: dict) -> list[str]:
    counts = progress.get("counts") or {}
    excluded = {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("excluded:")}
    eligible = counts.get("eligible", counts.get("episodes", 0))
    total = counts.get("episodes_total", eligible + sum(excluded.values()))
    why = ", ".join(f"{reason} {n}" for reason, n in sorted(excluded.items())) or "none"
    return [f"Data: {total} episodes, {eligible} eligible, {sum(excluded.values())} "
            f"excluded ({why})."]


def _agreement(found: dict | None, whom: str) -> str:
    if not found or not found.get("n"):
        uncovered = (found or {}).get("uncovered", 0)
        return f"no {whom} to compare with" + (f" ({uncovered} not judged)" if uncovered else "")
    text = f"{found['agree']} of {found['n']} ({found['percent']}%) with {whom}"
    return text + (f", {found['uncovered']} not judged" if found.get("uncovered") else "")


def reward_lines(progress: dict) -> list[str]:
    rewards = progress.get("rewards") or {}
    order = [s for s in SOURCES if s in rewards] + sorted(set(rewards) - set(SOURCES))
    parts = [f"{source} {_num(rewards[source].get('mean'), 2, True)} ± "
             f"{_num(rewards[source].get('spread'), 2)} (n={rewards[source].get('n', 0)})"
             for source in order]
    agreement = progress.get("judge_agreement") or {}
    givers = [labeller_line(progress)] if progress.get("labellers") else []
    return [f"Rewards: {'; '.join(parts) or 'none recorded'}.", *givers,
            f"Judge agreement: {_agreement(agreement.get('person'), 'people')}; "
            f"{_agreement(agreement.get('verifier'), 'checks')}."]


def labeller_line(progress: dict) -> str:
    """Who labelled what (``trainer.labellers``): per giver, the episodes their labels
    decided, and those set aside past a person's share of the night."""
    report = progress.get("labellers") or {}
    if not report:
        return "Labels: none counted."
    parts = []
    for giver, entry in sorted(report.items(), key=lambda kv: (-sum(kv[1].values()), kv[0])):
        text = f"{giver} {entry.get('accepted', 0)} ✅ {entry.get('rejected', 0)} ❌"
        if entry.get("set_aside"):
            text += f", {entry['set_aside']} set aside (past their share of the night)"
        parts.append(text)
    return "Labels by giver: " + "; ".join(parts) + "."


def _mean(values: list) -> float | None:
    found = [v for v in values if isinstance(v, (int, float))]
    return sum(found) / len(found) if found else None


def training_lines(progress: dict) -> list[str]:
    trained = progress.get("trained")
    history = progress.get("train_history") or []
    if not trained and not history:
        return ["Training: none recorded."]
    trained = trained or {}
    head = (f"Training: {trained.get('steps', len(history))} steps, "
            f"{trained.get('sequences', '?')} sequences, {trained.get('tokens', '?')} tokens, "
            f"{trained.get('seconds', '?')} s.")
    if not history:
        return [head]
    first, last = history[0], history[-1]
    loss = "; ".join(f"{k} {_num(first.get(k), 4)} → {_num(last.get(k), 4)}"
                     for k in ("oapl", "echo", "imitation", "total")
                     if k != "imitation" or first.get(k) is not None)  # a night with examples
    ratios = "; ".join(f"{label} {_num(_mean([h.get(k) for h in history]), 3, True)} "
                       f"(last {_num(last.get(k), 3, True)})"
                       for k, label in (("logratio_pos", "positive"),
                                        ("logratio_neg", "negative")))
    return [head, *_budget_line(trained), *_step_times(history),
            f"Loss (first → last step): {loss}.",
            f"Log-ratio, mean over steps: {ratios}.", *group_lines(progress)]


def _step_times(history: list[dict]) -> list[str]:
    """The steps' seconds, the first half's mean beside the second's: the steps of the first
    pass over the data also compute pi_lag for the sequences they meet, and the budget judges
    the night by its mean step."""
    times = [h["seconds"] for h in history if isinstance(h.get("seconds"), (int, float))]
    if len(times) < 2:
        return []
    half = len(times) // 2
    return [f"Step times: {_num(min(times), 1)}–{_num(max(times), 1)} s; the first "
            f"{half} steps {_num(_mean(times[:half]), 1)} s on average, the last "
            f"{len(times) - half} {_num(_mean(times[half:]), 1)} s."]


def _budget_line(trained: dict) -> list[str]:
    lines = [f"Budget: {trained['budget_note']}."] if trained.get("budget_note") else []
    if trained.get("stop_note"):
        lines.append(f"Stopped on evidence: {trained['stop_note']}.")
    return lines


def group_lines(progress: dict, worst: int = 3) -> list[str]:
    """Practice groups with mixed rewards: did their passing attempts gain log-probability
    against their failing ones (trainer.margins), and how far apart were their advantages."""
    found = progress.get("groups_summary")
    if not found:
        return []
    if not found.get("groups"):
        return ["Practice groups with mixed rewards: none (no group-relative signal tonight)."]
    lines = [f"Practice groups with mixed rewards: {found['groups']}; advantage spread "
             f"{_num(found.get('adv_spread'), 2)} (mean s.d.); passing against failing "
             f"attempts, per-token log-prob change after training: "
             f"{_num(found.get('margin'), 3, True)} nats (passing "
             f"{_num(found.get('pass_change'), 3, True)}, failing "
             f"{_num(found.get('fail_change'), 3, True)}); {found.get('gained', 0)} of "
             f"{found['groups']} groups gained."]
    groups = [g for g in progress.get("groups") or [] if g.get("margin") is not None]
    if groups:
        low = sorted(groups, key=lambda g: g["margin"])[:worst]
        lines.append("Least moved: " + "; ".join(
            f"{g['group']} {_num(g['margin'], 3, True)} ({g['passing']} passed, "
            f"{g['failing']} failed, spread {_num(g['adv_spread'], 2)})" for g in low) + ".")
    return lines


def gate_lines(progress: dict, release: dict | None) -> list[str]:
    gate = progress.get("gate")
    if not gate:
        return ["Gate: not run."]
    outcome = gate.get("outcome") or ("promote" if gate.get("passed") else "reject")
    lines = [f"Gate: {outcome}. " + " ".join(gate.get("reasons") or [])]
    families = gate.get("families") or {}
    if families:
        lines.append("Before → after per family: " + "; ".join(
            f"{name} {_num(f.get('before'), 2)} → {_num(f.get('after'), 2)} (n={f.get('n')})"
            for name, f in families.items()) + ".")
    if gate.get("open_before") is not None or gate.get("open_after") is not None:
        lines.append(f"Open chat (judged, -1..1): {_num(gate.get('open_before'), 2)} → "
                     f"{_num(gate.get('open_after'), 2)}.")
    lines.append(release_line(progress, release))
    return lines


def release_line(progress: dict, release: dict | None) -> str:
    if release is None:
        return f"Release: #{progress['release_id']}." if "release_id" in progress \
            else "Release: none."
    text = f"Release: #{release['id']} {release['name']} ({release['state']})"
    if progress.get("promotion"):
        text += f"; {progress['promotion']}"
    return text + "."


def report_text(job: dict, release: dict | None = None) -> str:
    """The whole report of one night, from its job row (and its release's row)."""
    progress = job.get("progress") or {}
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(job.get("updated_at") or 0))
    lines = [f"**Night #{job['id']} report** ({job['state']}, {when})"]
    lines += data_lines(progress) + reward_lines(progress) + training_lines(progress)
    lines += gate_lines(progress, release)
    if job.get("error"):
        lines.append("Error: " + job["error"].splitlines()[0][:300])
    return "\n".join(lines)


def history_text(releases: list[dict]) -> str:
    """The release chain, newest first: each release, its base, and its gate figures."""
    if not releases:
        return "No release yet: the base model has always served."
    by_id = {r["id"]: r for r in releases}
    lines = ["**Releases** (newest first)"]
    for release in sorted(releases, key=lambda r: r["id"], reverse=True):
        meta = release.get("meta") or {}
        base = meta.get("base_release_id")
        base_name = "the base model" if base is None else (
            f"#{base} {by_id[base]['name']}" if base in by_id else f"#{base}")
        gate = meta.get("gate") or {}
        figures = (f"gate {gate.get('outcome', 'n/a')}: gain {_num(gate.get('gain'), 3, True)} "
                   f"[{_num(gate.get('lower'), 3, True)}, {_num(gate.get('upper'), 3, True)}] "
                   f"on {gate.get('n', 0)} items" if gate else "no gate figures")
        families = "; ".join(f"{n} {_num(f.get('before'), 2)}→{_num(f.get('after'), 2)}"
                             for n, f in (gate.get("families") or {}).items())
        night = f", night #{meta['night']}" if meta.get("night") is not None else ""
        lines.append(f"#{release['id']} {release['name']} [{release['state']}] on {base_name}"
                     f"{night} · {figures}" + (f" · {families}" if families else ""))
    return "\n".join(lines)


# -- the reports ----------------------------------------------------------------------


class NightReports:
    """Builds night reports and sends each finished night's once, to its listeners."""

    def __init__(self, config: Config, store: Store) -> None:
        self.config = config
        self.store = store
        self.listeners: list[Listener] = []
        self._lock = asyncio.Lock()  # two polls at once must not both send a night's report

    def folder(self, job_id: int) -> Path:
        return self.config.data_dir / "reports" / f"night-{job_id:04d}"

    def channel(self, job: dict) -> str:
        return (self.config.night.report_channel or str(job["args"].get("channel") or "")
                or self.config.sleep.announce_channel)

    async def build(self, job_id: int | None = None, plots: bool = True) -> NightReport:
        """Night ``job_id``'s report (the newest night's if None); ValueError if none."""
        jobs = await self.store.jobs("sleep")
        if not jobs:
            raise ValueError("no night has run yet")
        job = jobs[-1] if job_id is None else next((j for j in jobs if j["id"] == job_id), None)
        if job is None:
            raise ValueError(f"no night #{job_id}; nights: "
                             + ", ".join(f"#{j['id']}" for j in jobs[-10:]))
        release_id = job["progress"].get("release_id")
        release = next((r for r in await self.store.releases() if r["id"] == release_id), None)
        report = NightReport(job["id"], report_text(job, release), channel=self.channel(job))
        if plots:
            series = plot_series(jobs, job["id"])
            try:
                report.files = await asyncio.to_thread(render, series, self.folder(job["id"]))
            except Exception as exc:  # the text still goes out; the log has why
                logger.exception("night #%s: the plots failed", job["id"])
                report.text += f"\n(The plots could not be drawn: {type(exc).__name__}: {exc})"
        return report

    async def on_job(self, job: dict) -> None:
        """A night watch listener: report a finished night, once."""
        if not finished(job, self.config.night.auto_promote):
            return
        # Held while sending too: a second caller (the console about to stop) returns only
        # once the report is out.
        async with self._lock:
            sent = {e["payload"].get("job_id") for e in await self.store.events(REPORT_EVENT)}
            if job["id"] in sent:
                return
            # Recorded first: a report that fails to send is not retried at every poll.
            await self.store.add_event(REPORT_EVENT_CHANNEL, None, REPORT_EVENT,
                                       {"job_id": job["id"]})
            report = await self.build(job["id"])
            logger.info("night report for #%s:\n%s", job["id"], report.text)
            for listener in list(self.listeners):
                try:
                    await listener(report)
                except asyncio.CancelledError:
                    raise
                except Exception:  # one front end's failure must not keep it from others
                    logger.exception("night report listener failed")

    async def report_command(self, night: int | None = None) -> str:
        report = await self.build(night)
        names = ", ".join(str(p) for p in report.files)
        return report.text + (f"\nPlots: {names}" if names else "")

    async def history_command(self) -> str:
        return history_text(await self.store.releases())
