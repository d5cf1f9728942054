"""The night report: what the trainer records for it, its text, its plots, its commands,
and its delivery once per finished night (the Discord delivery: test_discord_report.py)."""

from __future__ import annotations

import io
import json
import zlib

import pytest

from bot.app import console_report
from bot.commands import Caller, run_command
from bot.console import ConsoleRenderer
from bot.night import plots
from bot.night.report import REPORT_EVENT, finished, history_text, report_text
from core.config import Config
from core.storage.store import Store
from tests.test_nightwatch import make_release, runtime
from trainer.gate import family_scores
from trainer.gate_items import Item, eval_items, read_items
from trainer.judge import SubTask
from trainer.rewards import reward_stats
from trainer.sleep import Night

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LOCAL = Caller(0, (), "console", "console", local=True)


def planted_progress(night: int, *, judge_mean: float = 0.1, after: float = 0.6) -> dict:
    """A finished night's progress, as trainer.sleep writes it."""
    return {
        "counts": {"episodes": 9, "eligible": 9, "episodes_total": 12, "excluded:secret": 2,
                   "excluded:incomplete": 1, "source:judge": 5, "source:verifier": 4},
        "rewards": {"judge": {"n": 5, "mean": judge_mean, "spread": 0.4},  # as reward_stats
                    "person": {"n": 2, "mean": -1.0, "spread": 0.0},  # sorts them
                    "verifier": {"n": 4, "mean": 0.5, "spread": 0.866}},
        "judge_agreement": {"person": {"n": 4, "agree": 3, "percent": 75.0, "uncovered": 1},
                            "verifier": {"n": 0, "agree": 0, "percent": None, "uncovered": 0}},
        "trained": {"steps": 3, "sequences": 12, "tokens": 3456, "seconds": 12.5},
        "train_history": [
            {"step": 1, "oapl": 0.9, "echo": 0.2, "total": 1.1, "logratio_pos": 0.0,
             "logratio_neg": 0.0},
            {"step": 2, "oapl": 0.6, "echo": 0.19, "total": 0.79, "logratio_pos": 0.02,
             "logratio_neg": -0.05},
            {"step": 3, "oapl": 0.4, "echo": 0.18, "total": 0.58, "logratio_pos": 0.04,
             "logratio_neg": None},
        ],
        "gate": {"outcome": "promote", "passed": True, "n": 24, "gain": 0.125, "lower": 0.06,
                 "upper": 0.19, "reasons": ["gain +0.125, 90% interval [+0.060, +0.190] on 24 "
                                            "items: its lower end reaches the margin +0.050"],
                 "open_before": 0.4, "open_after": 0.45, "items": {},
                 "families": {"arith": {"n": 20, "before": 0.3, "after": after},
                              "eval": {"n": 4, "before": 0.5, "after": 0.5}}},
        "release_id": night, "outcome": "promote",
    }


def job(night: int, state: str = "done", **progress) -> dict:
    return {"id": night, "kind": "sleep", "state": state, "args": {}, "error": "",
            "updated_at": 1_700_000_000.0, "progress": planted_progress(night, **progress)}


# -- what the trainer records -----------------------------------------------------------


def test_reward_stats_give_each_sources_mean_and_spread():
    subtasks = [SubTask("c", 0, 1, "d", r, 1, source=s, key=f"k{i}")
                for i, (s, r) in enumerate([("verifier", 1.0), ("verifier", -1.0),
                                            ("judge", 0.5), ("person", 1.0)])]
    stats = reward_stats(subtasks)
    assert stats == {"judge": {"n": 1, "mean": 0.5, "spread": 0.0},
                     "person": {"n": 1, "mean": 1.0, "spread": 0.0},
                     "verifier": {"n": 2, "mean": 0.0, "spread": 1.0}}


def test_the_gates_scores_are_grouped_by_practice_family(tmp_path):
    heldout = tmp_path / "arith.jsonl"
    heldout.write_text('{"id": "a1", "prompt": "1+1", "check": {"exact": "2"}}\n'
                       '{"id": "a2", "prompt": "2+2", "check": {"exact": "4"}}\n')
    items = read_items(heldout) + eval_items([{"kind": "episode", "split": "eval",
                                               "episode_id": 7, "messages": [
                                                   {"role": "user", "content": "hi"}]}], 5)
    assert [i.family for i in items] == ["arith", "arith", "eval"]
    pairs = {"a1": [0.0, 1.0], "a2": [1.0, 1.0], "episode:7": [0.5, 0.25]}
    items.append(Item("unpaired", "x", {"exact": "y"}, "arith"))  # not scored on both sides
    assert family_scores(items, pairs) == {"arith": {"n": 2, "before": 0.5, "after": 1.0},
                                           "eval": {"n": 1, "before": 0.5, "after": 0.25}}


async def test_each_training_step_is_kept_in_the_jobs_progress(tmp_path):
    config = Config()
    config.paths.data_dir = tmp_path
    store = await Store.open(config.store_path)
    try:
        job_id = await store.create_job("sleep", {})
        night = Night(config, store, job_id)
        for step, neg in ((1, None), (2, -0.5)):
            await night._training_step({"step": step, "steps": 2, "lr": 1e-3 / step,
                                        "oapl": 0.5 / step,
                                        "echo": 0.1, "imitation": 0.2 * step,
                                        "total": 0.5 / step + 0.1,
                                        "logratio_pos": 0.01 * step, "logratio_neg": neg,
                                        "tokens_per_s": 99.0, "grad_norm": 1.0,
                                        "seconds": 30.0 / step})
        progress = (await store.job(job_id))["progress"]
    finally:
        await store.close()
    assert progress["train_history"] == [
        {"step": 1, "lr": 1e-3, "oapl": 0.5, "echo": 0.1, "imitation": 0.2, "total": 0.6,
         "logratio_pos": 0.01, "logratio_neg": None, "seconds": 30.0},
        {"step": 2, "lr": 5e-4, "oapl": 0.25, "echo": 0.1, "imitation": 0.4, "total": 0.35,
         "logratio_pos": 0.02, "logratio_neg": -0.5, "seconds": 15.0}]
    assert progress["train_step"]["total"] == 0.35


# -- the text -------------------------------------------------------------------------


def test_the_text_report_tells_data_rewards_training_and_gate():
    release = {"id": 3, "name": "night-0003", "state": "live"}
    text = report_text(job(3, state="live"), release)
    lines = text.splitlines()
    assert lines[0].startswith("**Night #3 report** (live")
    assert "Data: 12 episodes, 9 eligible, 3 excluded (incomplete 1, secret 2)." in lines
    assert ("Rewards: verifier +0.50 ± 0.87 (n=4); person -1.00 ± 0.00 (n=2); "
            "judge +0.10 ± 0.40 (n=5).") in lines
    assert ("Judge agreement: 3 of 4 (75.0%) with people, 1 not judged; "
            "no checks to compare with.") in lines
    assert "Training: 3 steps, 12 sequences, 3456 tokens, 12.5 s." in lines
    assert ("Loss (first → last step): oapl 0.9000 → 0.4000; echo 0.2000 → 0.1800; "
            "total 1.1000 → 0.5800.") in lines
    # The mean skips a step that had no negative message.
    assert "Log-ratio, mean over steps: positive +0.020 (last +0.040); negative -0.025 " \
           "(last n/a)." in lines
    assert lines[7].startswith("Gate: promote. gain +0.125")
    assert "Before → after per family: arith 0.30 → 0.60 (n=20); eval 0.50 → 0.50 (n=4)." \
        in lines
    assert "Open chat (judged, -1..1): 0.40 → 0.45." in lines
    assert lines[-1] == "Release: #3 night-0003 (live)."


def test_a_night_with_no_training_or_gate_says_so():
    empty = {"id": 5, "kind": "sleep", "state": "failed", "args": {}, "updated_at": 0,
             "error": "RuntimeError: boom\ntraceback", "progress": {"counts": {"episodes": 0}}}
    text = report_text(empty)
    assert "Data: 0 episodes, 0 eligible, 0 excluded (none)." in text
    assert "Rewards: none recorded." in text and "Training: none recorded." in text
    assert "Gate: not run." in text and text.endswith("Error: RuntimeError: boom")


def test_a_night_is_finished_once_its_gate_decided_and_its_promotion_was_tried():
    assert finished(job(1, state="done"), auto_promote=False)
    waiting = job(1, state="awaiting_promotion")
    assert finished(waiting, auto_promote=False)  # it waits for /promote: report now
    assert not finished(waiting, auto_promote=True)  # the watch is about to promote it
    waiting["progress"]["promotion"] = "Release #1 failed to start"
    assert finished(waiting, auto_promote=True)
    training = job(1, state="training")
    assert not finished(training, auto_promote=False)
    del training["progress"]["gate"]
    training["state"] = "done"
    assert not finished(training, auto_promote=False)


def test_history_lists_the_chain_with_gate_figures():
    gate = planted_progress(2)["gate"]
    releases = [{"id": 1, "name": "night-0001", "state": "retired",
                 "meta": {"night": 1, "base_release_id": None, "gate": gate}},
                {"id": 2, "name": "night-0002", "state": "live",
                 "meta": {"night": 2, "base_release_id": 1, "gate": gate}},
                {"id": 3, "name": "night-0003", "state": "rejected", "meta": {}}]
    lines = history_text(releases).splitlines()
    assert lines[1] == ("#3 night-0003 [rejected] on the base model · no gate figures")
    assert lines[2] == ("#2 night-0002 [live] on #1 night-0001, night #2 · gate promote: gain "
                        "+0.125 [+0.060, +0.190] on 24 items · arith 0.30→0.60; eval 0.50→0.50")
    assert lines[3].startswith("#1 night-0001 [retired] on the base model, night #1")
    assert history_text([]).startswith("No release yet")


# -- the plots ----------------------------------------------------------------------------


def png_text_chunks(data: bytes) -> dict[str, str]:
    """The tEXt/zTXt/iTXt chunks of a PNG, read by hand (no image library)."""
    assert data[:8] == PNG_MAGIC
    out, at = {}, 8
    while at < len(data):
        size = int.from_bytes(data[at:at + 4], "big")
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + size]
        assert zlib.crc32(kind + body) == int.from_bytes(data[at + 8 + size:at + 12 + size],
                                                         "big")
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed, rest = rest[0], rest[2:]
            rest = rest.split(b"\0", 2)[2]
            out[key.decode()] = (zlib.decompress(rest) if compressed else rest).decode()
        at += 12 + size
    return out


def nan_to_none(values) -> list:
    return [None if v != v else v for v in (float(x) for x in values)]


def test_the_plots_are_valid_pngs_of_the_expected_series(tmp_path):
    jobs = [job(1, judge_mean=-0.2, after=0.4), job(2, judge_mean=0.3, after=0.7),
            job(4, state="training")]  # a later night is not part of night 2's report
    jobs[0]["progress"]["rewards"].pop("person")
    series = plots.plot_series(jobs, 2)
    assert series["rewards"]["nights"] == [1, 2]
    assert series["rewards"]["sources"]["judge"]["mean"] == [-0.2, 0.3]
    assert series["rewards"]["sources"]["person"]["mean"] == [None, -1.0]
    assert list(series["rewards"]["sources"]) == ["verifier", "person", "judge"]
    assert series["loss"]["step"] == [1, 2, 3]
    assert series["loss"]["total"] == [1.1, 0.79, 0.58]
    assert series["loss"]["logratio_neg"] == [0.0, -0.05, None]
    assert series["heldout"]["families"]["arith"] == {"before": [0.3, 0.3], "after": [0.4, 0.7],
                                                      "n": [20, 20]}

    paths = plots.render(series, tmp_path / "out")
    assert [p.name for p in paths] == ["rewards.png", "loss.png", "heldout.png"]
    for path, name in zip(paths, ("rewards", "loss", "heldout")):
        chunks = png_text_chunks(path.read_bytes())
        assert json.loads(chunks[plots.SERIES_KEY]) == series[name]
    assert not list((tmp_path / "out").glob("*.partial"))

    # What is drawn is the series: the lines' data, not the pixels.
    loss = plots.draw_loss(series["loss"])
    top, bottom = loss.axes
    assert {l.get_label(): nan_to_none(l.get_ydata()) for l in top.get_lines()} == {
        "oapl": [0.9, 0.6, 0.4], "echo": [0.2, 0.19, 0.18], "total": [1.1, 0.79, 0.58]}
    ratios = {l.get_label(): nan_to_none(l.get_ydata()) for l in bottom.get_lines()
              if not l.get_label().startswith("_")}
    assert ratios == {"positive messages": [0.0, 0.02, 0.04],
                      "negative messages": [0.0, -0.05, None]}
    held = plots.draw_heldout(series["heldout"]).axes[0]
    drawn = {l.get_label(): (list(l.get_xdata()), nan_to_none(l.get_ydata()), l.get_linestyle())
             for l in held.get_lines()}
    assert drawn["arith before"] == ([1, 2], [0.3, 0.3], "--")
    assert drawn["arith after"] == ([1, 2], [0.4, 0.7], "-")
    rewards = plots.draw_rewards(series["rewards"]).axes[0]
    means = {c.get_label(): nan_to_none(c.lines[0].get_ydata()) for c in rewards.containers}
    assert means == {"verifier": [0.5, 0.5], "person": [None, -1.0], "judge": [-0.2, 0.3]}


def test_plots_of_a_night_without_data_are_still_valid_pngs(tmp_path):
    series = plots.plot_series([{"id": 1, "progress": {}}], 1)
    assert series["loss"]["step"] == [] and series["rewards"]["nights"] == []
    for path in plots.render(series, tmp_path):
        assert path.read_bytes()[:8] == PNG_MAGIC


# -- the commands and the delivery ----------------------------------------------------------


async def plant_night(rt, night_progress: dict, state: str = "done") -> int:
    job_id = await rt.store.create_job("sleep", {"channel": "ops"})
    path, meta = make_release(rt.config.data_dir, f"night-{job_id:04d}")
    release = await rt.store.add_release(f"night-{job_id:04d}", path,
                                          {**meta, "night": job_id, "base_release_id": None,
                                           "gate": night_progress["gate"]})
    await rt.store.update_job(job_id, state=state,
                              progress={**night_progress, "release_id": release})
    return job_id


async def test_history_and_report_run_through_the_command_table(tmp_path):
    rt = await runtime(tmp_path)
    try:
        assert (await run_command(rt, LOCAL, "history")).text.startswith("No release yet")
        assert "no night has run yet" in (await run_command(rt, LOCAL, "report")).text
        first = await plant_night(rt, planted_progress(1))
        second = await plant_night(rt, planted_progress(2, after=0.9))
        history = (await run_command(rt, LOCAL, "history")).text
        assert f"#2 night-{second:04d} [candidate]" in history and "arith 0.30→0.90" in history
        newest = (await run_command(rt, LOCAL, "report")).text
        assert newest.startswith(f"**Night #{second} report**") and "arith 0.30 → 0.90" in newest
        older = (await run_command(rt, LOCAL, "report", night=first)).text
        assert older.startswith(f"**Night #{first} report**") and "arith 0.30 → 0.60" in older
        plotted = [line.split(": ", 1)[1] for line in older.splitlines()[-1:]]
        assert plotted[0].endswith("heldout.png")
        missing = (await run_command(rt, LOCAL, "report", night=99)).text
        assert "no night #99" in missing and "usage: /report [NIGHT]" in missing
        refused = await run_command(rt, Caller(5, (), "c", "bob"), "report")
        assert refused.refused
    finally:
        await rt.close()


@pytest.mark.parametrize("auto_promote", [False, True])
async def test_a_finished_night_is_reported_once_to_its_channel(tmp_path, auto_promote):
    rt = await runtime(tmp_path, auto_promote=auto_promote)
    got = []

    async def listener(report):
        got.append(report)

    rt.reports.listeners.append(listener)
    try:
        job_id = await rt.store.create_job("sleep", {"channel": "ops"})
        await rt.store.update_job(job_id, state="training", progress={"stage": "training"})
        await rt.night.poll()
        assert got == []
        progress = planted_progress(job_id)
        await plant_gate(rt, job_id, progress)
        await rt.night.poll()  # with auto-promote the watch promotes first, then reports
        await rt.night.poll()
        await rt.night.poll()
        assert [r.job_id for r in got] == [job_id] and got[0].channel == "ops"
        assert [p.name for p in got[0].files] == ["rewards.png", "loss.png", "heldout.png"]
        assert all(p.read_bytes()[:8] == PNG_MAGIC for p in got[0].files)
        state = (await rt.store.job(job_id))["state"]
        assert state == ("live" if auto_promote else "awaiting_promotion")
        assert f"Night #{job_id} report** ({state}" in got[0].text
        assert len(await rt.store.events(REPORT_EVENT)) == 1
    finally:
        await rt.close()


async def plant_gate(rt, job_id: int, progress: dict) -> None:
    """The trainer's end of a promoted night: its release, and the job awaiting promotion."""
    path, meta = make_release(rt.config.data_dir, f"night-{job_id:04d}")
    release = await rt.store.add_release(f"night-{job_id:04d}", path,
                                          {**meta, "night": job_id, "gate": progress["gate"]})
    await rt.store.update_job(job_id, state="awaiting_promotion",
                              progress={**progress, "release_id": release})


async def test_the_report_goes_to_the_configured_channel_and_not_again_after_a_restart(
        tmp_path):
    rt = await runtime(tmp_path)
    rt.config.night.report_channel = "reports-here"
    got = []

    async def listener(report):
        got.append(report)

    rt.reports.listeners.append(listener)
    try:
        job_id = await rt.store.create_job("sleep", {"channel": "ops"})
        await plant_gate(rt, job_id, planted_progress(job_id))
        await rt.night.poll()
        assert [r.channel for r in got] == ["reports-here"]
    finally:
        await rt.close()
    rt = await runtime(tmp_path)  # the same store: the night waits for /promote again
    rt.reports.listeners.append(listener)
    try:
        await rt.night.poll()
        assert len(got) == 1
    finally:
        await rt.close()


async def test_the_console_prints_the_report_and_its_plots(tmp_path):
    rt = await runtime(tmp_path)
    out = io.StringIO()
    rt.reports.listeners.append(console_report(ConsoleRenderer(out, io.StringIO())))
    try:
        job_id = await rt.store.create_job("sleep", {"channel": "general"})
        await plant_gate(rt, job_id, planted_progress(job_id))
        await rt.night.poll()
    finally:
        await rt.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(f"[#general] **Night #{job_id} report** (awaiting_promotion")
    assert "Gate: promote." in out.getvalue()
    folder = tmp_path / "reports" / f"night-{job_id:04d}"
    assert lines[-3:] == [f"[#general] (file sent: {folder / name}.png)"
                          for name in ("rewards", "loss", "heldout")]


async def test_a_report_whose_plots_fail_still_goes_out_with_its_text(tmp_path, monkeypatch):
    rt = await runtime(tmp_path)
    got = []

    async def listener(report):
        got.append(report)

    def broken(series, folder):
        raise OSError("disk full")

    monkeypatch.setattr("bot.night.report.render", broken)
    rt.reports.listeners.append(listener)
    try:
        job_id = await rt.store.create_job("sleep", {"channel": "ops"})
        await plant_gate(rt, job_id, planted_progress(job_id))
        await rt.night.poll()
    finally:
        await rt.close()
    [report] = got
    assert report.files == [] and "Gate: promote." in report.text
    assert report.text.endswith("(The plots could not be drawn: OSError: disk full)")


def test_a_night_with_demonstrations_reports_and_plots_its_imitation_loss():
    from bot.night.plots import loss_series
    from bot.night.report import training_lines

    history = [{"step": 1, "oapl": 0.5, "echo": 0.1, "imitation": 4.2, "total": 4.8},
               {"step": 2, "oapl": 0.4, "echo": 0.1, "imitation": 0.36, "total": 0.86}]
    assert loss_series({"train_history": history})["imitation"] == [4.2, 0.36]
    assert "imitation" not in loss_series({"train_history": [{"step": 1, "oapl": 0.5}]})
    text = " ".join(training_lines({"train_history": history}))
    assert "imitation 4.2000 → 0.3600" in text


def test_the_report_shows_the_mixed_groups_margins_and_a_budget_cut():
    night = job(6)
    night["progress"]["trained"].update(
        planned_steps=16, budget_note="trained 3 of 16 planned steps: at 500 tokens/s the rest "
        "would have run past the 700 s the night's budget left for training (night.budget_s)")
    night["progress"]["groups_summary"] = {"groups": 2, "adv_spread": 0.8, "pass_change": 0.1,
                                           "fail_change": -0.2, "margin": 0.3, "gained": 1}
    night["progress"]["groups"] = [
        {"group": "run-1:a", "attempts": 4, "passing": 2, "failing": 2, "adv_spread": 1.0,
         "margin": 0.7},
        {"group": "run-1:b", "attempts": 4, "passing": 1, "failing": 3, "adv_spread": 0.6,
         "margin": -0.1}]
    lines = report_text(night).splitlines()
    assert "Budget: trained 3 of 16 planned steps: at 500 tokens/s the rest would have run " \
           "past the 700 s the night's budget left for training (night.budget_s)." in lines
    assert ("Practice groups with mixed rewards: 2; advantage spread 0.80 (mean s.d.); "
            "passing against failing attempts, per-token log-prob change after training: "
            "+0.300 nats (passing +0.100, failing -0.200); 1 of 2 groups gained.") in lines
    assert ("Least moved: run-1:b -0.100 (1 passed, 3 failed, spread 0.60); "
            "run-1:a +0.700 (2 passed, 2 failed, spread 1.00).") in lines
    night["progress"]["groups_summary"] = {"groups": 0}
    assert "Practice groups with mixed rewards: none (no group-relative signal tonight)." \
        in report_text(night)
    assert "Practice groups" not in report_text(job(7))  # a night before this was logged


def test_the_report_says_when_held_out_practice_groups_stopped_the_night():
    night = job(7)
    night["progress"]["trained"].update(
        steps=8, planned_steps=16, stop_note="kept step 4's weights: 5 held-out practice "
        "groups' margin peaked there (+0.120 nats a token), stopped after 8 of 16 steps")
    lines = report_text(night).splitlines()
    assert ("Stopped on evidence: kept step 4's weights: 5 held-out practice groups' margin "
            "peaked there (+0.120 nats a token), stopped after 8 of 16 steps.") in lines
    del night["progress"]["trained"]["stop_note"]
    assert not any(line.startswith("Stopped on evidence") for line in
                   report_text(night).splitlines())


def test_the_report_shows_the_first_steps_times_beside_the_last_ones():
    from bot.night.report import training_lines

    history = [{"step": 1, "oapl": 0.5, "seconds": 61.2}, {"step": 2, "oapl": 0.4, "seconds": 50.8},
               {"step": 3, "oapl": 0.3, "seconds": 30.4}, {"step": 4, "oapl": 0.3, "seconds": 33.0}]
    lines = training_lines({"trained": {"steps": 4}, "train_history": history})
    assert "Step times: 30.4–61.2 s; the first 2 steps 56.0 s on average, the last 2 31.7 s." \
        in lines
    # A night stored before the times were kept shows no such line.
    old = [{k: v for k, v in h.items() if k != "seconds"} for h in history]
    assert not any("Step times" in line for line in training_lines({"train_history": old}))
