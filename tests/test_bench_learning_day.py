"""bench/learning.py's kept day: ``--keep`` copies the data folder as the practice left
it, and ``--day`` starts another night from that copy, untouched by the first night."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # learning.py imports its sibling modules by name
spec = importlib.util.spec_from_file_location("bench_learning", ROOT / "bench/learning.py")
learning = importlib.util.module_from_spec(spec)
spec.loader.exec_module(learning)
import learning_kept as kept  # noqa: E402  (bench/ on the path above)


def test_a_kept_day_is_restored_as_it_was_before_the_night(tmp_path):
    first = tmp_path / "first"
    (first / "data" / "workspaces").mkdir(parents=True)
    (first / "data" / "nightshift.db").write_bytes(b"the day's store")
    (first / "data" / "workspaces" / "a.txt").write_text("practice output")
    listener = socket.socket(socket.AF_UNIX)  # a socket left behind is not data to copy
    listener.bind(str(first / "data" / "s"))
    try:
        learning.save_day(first, {"before": {"protocol": [0.0, 1.0]}, "before_s": 12.0}, 99.5)
    finally:
        listener.close()
    assert not (first / "day" / "s").exists()
    (first / "data" / "nightshift.db").write_bytes(b"after the first night")

    second = tmp_path / "second"
    second.mkdir()
    result, since = learning.load_day(first, second)
    assert since == 99.5
    assert result == {"before": {"protocol": [0.0, 1.0]}, "before_s": 12.0, "after": {},
                      "day_from": str(first)}
    assert (second / "data" / "nightshift.db").read_bytes() == b"the day's store"
    assert (second / "data" / "workspaces" / "a.txt").read_text() == "practice output"


def test_a_folder_without_a_kept_day_is_refused_with_what_to_do(tmp_path):
    (tmp_path / "work").mkdir()
    with pytest.raises(SystemExit, match="--keep DIR first"):
        learning.load_day(tmp_path, tmp_path / "work")
    assert not os.listdir(tmp_path / "work")


def test_the_report_names_the_gates_outcome_and_its_open_chat_scores(capsys):
    """An inconclusive gate was printed as "refused"; a gate with no paired items has no gain."""
    gate = {"outcome": "inconclusive", "passed": False, "gain": 0.15,
            "reasons": ["it includes the margin +0.050"], "open_before": 0.59, "open_after": 0.68}
    result = {"before": {"protocol": [0.0, 0.0]}, "after": {"protocol": [1.0, 0.0]},
              "night": {"job": {"id": 4, "state": "done", "progress": {"gate": gate}}}}
    learning.report(result, 0.0)
    out = capsys.readouterr().out
    assert "protocol" in out and "+50.0" in out and "mean delta: +50.0 pp" in out
    assert "gate: inconclusive (gain +0.150); it includes the margin +0.050" in out
    assert "open chat (the gate's prompts, judged in [-1, 1]): +0.59 before, +0.68 after" in out
    learning.report({**result, "night": {"job": {"progress": {"gate": {
        "outcome": "inconclusive", "passed": False, "gain": None, "reasons": []}}}}}, 0.0)
    assert "gate: inconclusive (no paired items)" in capsys.readouterr().out
    learning.report({**result, "night": {"job": {"progress": {
        "gate": gate, "gate_before_s": 151.6, "trained": {"budget_s": 812.4}}}}}, 0.0)
    assert ("the gate's live side: 152 s of its gating, answered before training; training "
            "was given 812 s") in capsys.readouterr().out


def test_held_out_answers_are_checked_and_their_tool_calls_counted(tmp_path, capsys):
    """evaluate's second list is each answer's rounds of tool calls (not its steps: a retry
    after a format error is a step); the report counts, per family, the answers that called
    a tool before and after, and a kept night keeps the count."""
    import asyncio
    from types import SimpleNamespace

    from bot.agent.loop import TurnResult
    from core.practice.sets import load_set
    from families import write_set

    path = write_set(tmp_path, "protocol", [
        {"id": "a", "prompt": "Say [A].", "check": {"exact": "[A]"}},
        {"id": "b", "prompt": "Say [B].", "check": {"exact": "[B]"}},
        {"id": "c", "prompt": "Say [C].", "check": {"exact": "[C]"}}])
    answers = {"Say [A].": ("[A]", 2, 0, True), "Say [B].": ("[B]", 3, 2, True),
               "Say [C].": ("(stopped)", 8, 7, False)}

    async def turn(channel, prompt, speaker):
        reply, steps, rounds, ok = answers[prompt]
        return TurnResult(channel, reply, 1, ok=ok, steps=steps, tool_rounds=rounds)

    space = SimpleNamespace(workspace=None, services=SimpleNamespace(sandbox=None))
    rt = SimpleNamespace(turn=turn, spaces=SimpleNamespace(context=lambda channel: space),
                         config=SimpleNamespace(practice=SimpleNamespace(check_timeout_s=5)))
    rewards, calls, replies = asyncio.run(learning.evaluate(rt, load_set(path), "after"))
    assert rewards == [1.0, 1.0, 0.0] and calls == [0, 2, 7]
    assert replies == ["[A]", "[B]", "(stopped)"]
    result = {"before": {"protocol": [0.0] * 3}, "after": {"protocol": rewards},
              "calls_before": {"protocol": [0, 0, 1]}, "calls_after": {"protocol": calls},
              "answers_after": {"protocol": replies}}
    learning.report(result, 0.0)
    assert ("held-out answers that called a tool, before -> after: protocol 1/3 -> 2/3"
            in capsys.readouterr().out)
    del result["calls_before"]  # a day kept before the bench counted them
    learning.report(result, 0.0)
    assert "protocol ? -> 2/3" in capsys.readouterr().out
    night = json.loads(kept.keep_night(tmp_path, result, ["--day"]).read_text())
    assert night["calls_after"] == {"protocol": [0, 2, 7]}
    assert night["answers_after"] == {"protocol": ["[A]", "[B]", "(stopped)"]}


def test_a_run_whose_checks_need_the_missing_sandbox_is_refused_before_it_starts(
        monkeypatch, capsys):
    """Without bubblewrap every tool check comes back unjudged: a 15-minute run that can only
    report nothing learnt. The arithmetic and protocol families need no sandbox."""
    monkeypatch.setattr(learning, "find_bwrap", lambda: None)
    monkeypatch.setattr(learning, "find_gguf", lambda gguf: "model.gguf")
    monkeypatch.setattr(sys, "argv", ["learning.py", "--quick"])
    with pytest.raises(SystemExit):
        learning.main()
    assert "bubblewrap is missing" in capsys.readouterr().err
    started = []

    def run(args, work, seed, keep=False, kept_day=None):
        started.append((args.families, seed, work.name))
        return {"before": {}, "after": {}}

    monkeypatch.setattr(learning, "run", run)
    monkeypatch.setattr(learning, "report", lambda result, t: None)
    monkeypatch.setattr(learning.asyncio, "run", lambda value: value)
    monkeypatch.setattr(sys, "argv", ["learning.py", "--quick", "--families", "protocol"])
    learning.main()
    assert [(f, seed) for f, seed, _ in started] == [(["protocol"], 0)]  # --quick: one day
    # --days N: N fresh days, each with its own items (seed + i) and its own folder.
    started.clear()
    monkeypatch.setattr(sys, "argv", ["learning.py", "--quick", "--families", "protocol",
                                      "--days", "3", "--seed", "5"])
    learning.main()
    assert started == [(["protocol"], 5, "day-1"), (["protocol"], 6, "day-2"),
                       (["protocol"], 7, "day-3")]
    assert "No day made a candidate" in capsys.readouterr().out


def test_every_held_out_item_reaches_the_gate_whatever_its_check(tmp_path):
    """The bench gave the gate only its exact-check items; a family with python checks
    (tool) reached it not at all, and the gate was inconclusive for "no paired items"."""
    import argparse

    from core.config import Config
    from trainer.gate_items import heldout_items

    args = argparse.Namespace(families=["arithmetic", "tool"], train=3, held=5)
    sets = learning.write_sets(tmp_path, args, seed=1)
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    items = heldout_items(config, {})
    assert len(items) == 10 and {i.family for i in items} == {"arithmetic-heldout",
                                                              "tool-heldout"}
    tool = [i for i in items if i.family == "tool-heldout"]
    assert all("python" in i.check and "def reward" in i.check["code"] for i in tool)
    held = learning.load_set(sets["tool"][1])
    assert [i.request for i in tool] == [t.prompt for t in held.tasks]
    # Another day draws other items.
    other = learning.write_sets(tmp_path / "other", args, seed=2)
    assert learning.load_set(other["tool"][1]).tasks != held.tasks


def test_days_are_tabulated_in_markdown_with_intervals_and_the_command_line():
    results = [{"before": {"a": [0.0, 0.0, 1.0, 0.0]}, "after": {"a": [1.0, 1.0, 1.0, 0.0]}},
               {"before": {"a": [0.0, 1.0, 0.0, 0.0]}, "after": {"a": [1.0, 1.0, 0.0, 1.0]}},
               {"before": {"a": [0.0] * 4}, "after": {}}]  # no candidate: left out
    days = learning.days_of(results)
    assert len(days) == 2
    text = learning.table(days, ["a"])
    assert "| family | before % | after % | Δ pp | 90% interval |" in text
    assert "| a | 25.0 | 75.0 | +50.0 | [" in text and "| **mean** | 25.0 | 75.0 | **+50.0** |" in text
    head = learning.header(["--days", "2"], [500.0, 700.0])
    assert head.startswith("`.venv/bin/python bench/learning.py --days 2`")
    assert "600 training tokens/s" in head


def test_a_night_on_a_kept_day_is_compared_item_by_item_with_the_one_before(tmp_path):
    first = learning.keep_night(tmp_path, {"after": {"a": [0.0, 0.0, 1.0, 0.0]}}, ["--lr", "1"])
    assert learning.compare_nights(tmp_path, first) is None  # nothing to compare with yet
    second = learning.keep_night(tmp_path, {"after": {"a": [1.0, 1.0, 1.0, 0.0]}},
                                 ["--day", "x", "--lr", "2"])
    text, answers = learning.compare_nights(tmp_path, second)
    assert f"{second.stem} against {first.stem}" in text
    assert "| a | 25.0 | 75.0 | +50.0 | [" in text
    assert "`--day x --lr 2`" in text and "`--lr 1`" in text
    assert answers == ({"a": [0.0, 0.0, 1.0, 0.0]}, {"a": [1.0, 1.0, 1.0, 0.0]})


def test_a_night_is_compared_with_the_kept_night_named_by_against(tmp_path):
    base = learning.keep_night(tmp_path, {"after": {"a": [0.0, 0.0, 0.0, 0.0]}}, ["--keep", "x"])
    learning.keep_night(tmp_path, {"after": {"a": [1.0, 1.0, 1.0, 1.0]}}, ["--lr", "2"])
    latest = learning.keep_night(tmp_path, {"after": {"a": [1.0, 0.0, 0.0, 0.0]}}, ["--lr", "3"])
    assert learning.kept_night(tmp_path, 0) == base and learning.kept_night(tmp_path, 9) is None
    text, answers = learning.compare_nights(tmp_path, latest, against=0)
    assert f"{latest.stem} against {base.stem}" in text
    assert "| a | 0.0 | 25.0 | +25.0 | [" in text  # not against night 1's 100%
    assert answers[0] == {"a": [0.0, 0.0, 0.0, 0.0]}
    assert learning.compare_nights(tmp_path, latest, against=9) is None
    pooled = learning.pooled_comparison([answers], ["a"], against=0)
    assert pooled.startswith("This night against kept night #0,")


def test_chained_nights_are_tabulated_against_the_night_before_and_the_day_before():
    result = {"before": {"a": [0.0, 0.0, 0.0, 0.0]}, "after": {"a": [1.0, 0.0, 0.0, 0.0]},
              "chain": [{"after": {"a": [1.0, 1.0, 1.0, 0.0]}}]}
    text = learning.chain_table([result], ["a"], 2)
    added, total = text.split("All 2 nights against the day's before:")
    assert "Night 2 against night 1" in added and "| a | 25.0 | 75.0 | +50.0 | [" in added
    assert "| a | 0.0 | 75.0 | +75.0 | [" in total
    assert "no day reached it" in learning.chain_table([{**result, "chain": []}], ["a"], 2)


def test_nights_on_several_kept_days_are_compared_pooled_over_the_days():
    pairs = [({"a": [0.0, 0.0, 1.0, 0.0]}, {"a": [1.0, 1.0, 1.0, 0.0]}),
             ({"a": [1.0, 0.0, 0.0, 0.0]}, {"a": [1.0, 0.0, 0.0, 0.0]})]
    text = learning.pooled_comparison(pairs, ["a"])
    assert "on each of 2 kept days" in text
    assert "| a | 25.0 | 50.0 | +25.0 | [" in text and "2 day(s)" in text


def test_a_kept_day_is_read_back_with_its_own_first_night_for_the_table(tmp_path):
    (tmp_path / "day").mkdir()
    (tmp_path / "day" / learning.DAY).write_text(json.dumps(
        {"since": 1.0, "before": {"a": [0.0, 1.0]}, "after": {}, "seed": 4}))
    learning.keep_night(tmp_path, {"after": {"a": [1.0, 1.0]}}, ["--keep", "x"])
    learning.keep_night(tmp_path, {"after": {"a": [0.0, 0.0]}}, ["--day", "x", "--lr", "2"])
    result = kept.kept_result(tmp_path)
    assert result == {"before": {"a": [0.0, 1.0]}, "after": {"a": [1.0, 1.0]}, "chain": [],
                      "seed": 4}


def test_a_later_night_kept_on_the_days_is_tabulated_against_the_days_before(tmp_path):
    """--tabulate DIRS --night N: the table of night N kept on each day (a setting rerun with
    --day), not the day's first night; a night some day lacks is refused by name."""
    folders = []
    for i in range(2):
        folder = tmp_path / f"day-{i + 1}"
        (folder / "day").mkdir(parents=True)
        (folder / "day" / learning.DAY).write_text(json.dumps(
            {"since": 1.0, "before": {"a": [0.0, 0.0, 0.0, 0.0]}, "after": {}, "seed": i}))
        learning.keep_night(folder, {"after": {"a": [1.0, 0.0, 0.0, 0.0]}}, [])
        learning.keep_night(folder, {"after": {"a": [1.0, 1.0, 1.0, 0.0]}}, ["--day"])
        folders.append(folder)
    assert "| a | 0.0 | 25.0 | +25.0 | [" in kept.tabulated(folders, ["a"], [])
    assert "| a | 0.0 | 75.0 | +75.0 | [" in kept.tabulated(folders, ["a"], [], night=1)
    with pytest.raises(ValueError, match=r"no night #2 is kept in .* \(kept: 0, 1\)"):
        kept.tabulated(folders, ["a"], [], night=2)
    # One number a day: day 1's night 1 (75%) and day 2's night 0 (25%) pool to 50%.
    assert "| a | 0.0 | 50.0 | +50.0 | [" in kept.tabulated(folders, ["a"], [], night=[1, 0])
    assert "| a | 0.0 | 75.0 | +75.0 | [" in kept.tabulated(folders, ["a"], [], night=[1])
    with pytest.raises(ValueError, match="--night gives 3 numbers for 2 days"):
        kept.tabulated(folders, ["a"], [], night=[1, 0, 1])
    for folder in folders:  # --versus needs the days' held-out items to match
        (folder / learning.SETS).mkdir()
        (folder / learning.SETS / "a-heldout.jsonl").write_text("q1\n")
    # Night 1 against night 0 of the same days, item by item.
    assert kept.versus_pairs(folders, folders, 0, 1)[0] == (
        {"a": [1.0, 0.0, 0.0, 0.0]}, {"a": [1.0, 1.0, 1.0, 0.0]})
    paired = kept.tabulated(folders, ["a"], [], folders, 0, 1).split("night #0 of the days")[1]
    assert "| a | 25.0 | 75.0 | +50.0 | [" in paired


def test_kept_days_chained_nights_are_kept_and_tabulated_pooled_over_the_days(tmp_path):
    """--nights 2 --keep: night 2's answers stay beside night 1's, so --tabulate pools what
    night 2 added over several kept days (the bench printed it only day by day)."""
    folders = []
    for i, (first, second) in enumerate([([1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]),
                                         ([0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0])]):
        folder = tmp_path / f"day-{i + 1}"
        (folder / "day").mkdir(parents=True)
        (folder / "day" / learning.DAY).write_text(json.dumps(
            {"since": 1.0, "before": {"a": [0.0, 0.0, 0.0, 0.0]}, "after": {}, "seed": i}))
        learning.keep_night(folder, {"after": {"a": first}, "chain": [{"after": {"a": second},
                                                                      "release": 7}]}, [])
        folders.append(folder)
    assert kept.kept_result(folders[0])["chain"] == [{"after": {"a": [1.0, 1.0, 0.0, 0.0]}}]
    text = kept.tabulated(folders, ["a"], ["--tabulate"])
    assert "| a | 0.0 | 12.5 | +12.5 | [" in text  # night 1 against before, both days
    added = text.split("Night 2 against night 1 (what it added):")[1]
    assert "| a | 12.5 | 62.5 | +50.0 | [" in added and "2 day(s)" in added


def test_two_settings_kept_days_are_compared_item_by_item_on_the_same_items(tmp_path):
    """--tabulate A --versus B: each A day's night against the matching B day's, paired per
    held-out item; days that do not hold the same items are refused, not compared."""
    def kept_day(name: str, items: str, nights: list[list[float]]) -> Path:
        folder = tmp_path / name
        (folder / "day").mkdir(parents=True)
        (folder / "day" / learning.DAY).write_text(json.dumps(
            {"since": 1.0, "before": {"a": [0.0, 0.0, 0.0, 0.0]}, "after": {}, "seed": 0}))
        (folder / learning.SETS).mkdir()
        (folder / learning.SETS / "a-heldout.jsonl").write_text(items)
        for answers in nights:
            learning.keep_night(folder, {"after": {"a": answers}}, [])
        return folder

    mine = kept_day("eight", "q1\nq2\n", [[1.0, 1.0, 1.0, 0.0]])
    theirs = kept_day("four", "q1\nq2\n", [[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert kept.versus_pairs([mine], [theirs]) == [
        ({"a": [0.0, 0.0, 0.0, 0.0]}, {"a": [1.0, 1.0, 1.0, 0.0]})]
    assert kept.versus_pairs([mine], [theirs], 1)[0][0] == {"a": [1.0, 0.0, 0.0, 0.0]}
    text = learning.pooled_comparison(kept.versus_pairs([mine], [theirs], 1), ["a"],
                                      earlier="night #1 of the days in four")
    assert text.startswith("This night against night #1 of the days in four,")
    assert "| a | 25.0 | 75.0 | +50.0 | [" in text
    other = kept_day("other", "q3\nq4\n", [[0.0, 0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="do not hold the same held-out items"):
        kept.versus_pairs([mine], [other])
    with pytest.raises(ValueError, match="no night #5 is kept"):
        kept.versus_pairs([mine], [theirs], 5)
    with pytest.raises(ValueError, match="1 kept days against 2"):
        kept.versus_pairs([mine], [theirs, other])
    # The whole --tabulate text: the days' own table, then the paired comparison.
    text = kept.tabulated([mine], ["a", "b"], ["--tabulate", "eight"], [theirs], 1)
    own, versus = text.split("This night against night #1 of the days in ")
    assert "| a | 0.0 | 75.0 | +75.0 | [" in own and "| b |" not in own
    assert "| a | 25.0 | 75.0 | +50.0 | [" in versus
    with pytest.raises(ValueError, match="do not hold the same held-out items"):
        kept.tabulated([mine], ["a"], [], [other])


async def test_first_attempts_leaves_a_groups_later_attempts_out_of_the_night(tmp_path):
    from core.storage.events import Event
    from core.storage.store import Store
    from trainer.rewards import verifier_rewards

    db = tmp_path / "nightshift.db"
    store = await Store.open(db)
    try:
        made = {}
        for channel in ["practice-s-t-1-0", "practice-s-t-1-1", "practice-s-t-1-2",
                        "practice-s-t-1-10", "practice-s-t-1-reference"]:
            episode = await store.start_episode(channel)
            made[channel] = episode
            await store.add_event(channel, episode, Event.VERIFIER_REWARD,
                                  {"reward": 1.0, "check": "exact", "task": "t",
                                   "task_id": "t", "set": "s", "group": "s:t:1"})
    finally:
        await store.close()
    assert await kept.only_first_attempts(db, 2) == 2
    store = await Store.open(db)
    try:
        verified = verifier_rewards(await store.events(Event.VERIFIER_REWARD))
    finally:
        await store.close()
    unjudged = {c for c, e in made.items() if verified[e].reward is None}
    assert unjudged == {"practice-s-t-1-2", "practice-s-t-1-10"}
    assert await kept.only_first_attempts(db, 2) == 0  # marked once


def test_first_attempts_is_refused_without_a_kept_day(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["learning.py", "--first-attempts", "4"])
    with pytest.raises(SystemExit):
        learning.main()
    assert "--first-attempts G (G >= 1) trains a kept day's night" in capsys.readouterr().err
