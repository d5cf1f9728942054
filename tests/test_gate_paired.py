"""A practice set whose checks are all python checks still gives the gate paired items:
``/practice`` publishes the held-out split with each check's code, the gate scores both
sides, and "too few items" comes only when a set really holds out too few, saying how
many more it needs. (The checks run unsandboxed here so that this runs where bubblewrap
is missing; tests/test_gate_checks.py runs them in the real sandbox.)"""

from __future__ import annotations

import json

from bot.practice.runner import publish_held_out
from core.config import Config
from core.practice.sets import load_set
from tests.test_gate import FINE_CHAT, SETTINGS, PlantedJudge
from trainer.gate import decide
from trainer.gate_checks import SandboxScorer
from trainer.gate_items import heldout_items
from trainer.gate_side import score_side

ANSWER = ("def reward(answer, workspace):\n"
          "    return 1.0 if answer.strip().lower() in ('ten', '10') else 0.0\n")


def python_only_set(tmp_path, n: int):
    (tmp_path / "ten.py").write_text(ANSWER)
    path = tmp_path / "words.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Six plus four, item {i}?",
                                        "check": {"python": "ten.py"}}) + "\n"
                            for i in range(n)))
    return load_set(path)


def config_at(tmp_path) -> Config:
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.sandbox.allow_unsandboxed = True
    return config


async def gate_on(config: Config, held: list) -> tuple:
    publish_held_out(config.data_dir / "heldout", "words", held)  # what /practice does
    items = heldout_items(config, {})
    score = SandboxScorer(config)
    before = await score_side(PlantedJudge(), items, ["eleven"] * len(items), FINE_CHAT, score)
    after = await score_side(PlantedJudge(), items, ["ten"] * (len(items) - 2) + ["9", "9"],
                             FINE_CHAT, score)
    return items, decide(before, after, SETTINGS, len(items)), score


async def test_a_practice_set_with_only_python_checks_gives_the_gate_paired_items(tmp_path):
    config = config_at(tmp_path)
    practised, held = python_only_set(tmp_path, 100).split(30)  # the product's split
    assert practised and len(held) >= SETTINGS.min_items
    items, report, score = await gate_on(config, held)
    assert all("python" in i.check and i.check["code"] == ANSWER for i in items)
    assert score.failures == []
    assert report.n == len(held)  # every held-out item paired
    assert report.gain == (len(held) - 2) / len(held) and report.outcome == "promote"


async def test_a_set_holding_out_too_few_is_inconclusive_and_says_how_many_more(tmp_path):
    config = config_at(tmp_path)
    _, held = python_only_set(tmp_path, 100).split(30)
    items, report, _ = await gate_on(config, held[:6])
    assert report.n == 6 and report.outcome == "inconclusive"
    assert "the gate needs at least 20 held-out items" in report.reasons[0]
    assert "had 6: it needs 14 more" in report.reasons[0]


async def test_checks_that_could_not_run_are_named_as_such_not_as_too_few_held_out(tmp_path):
    config = config_at(tmp_path)
    _, held = python_only_set(tmp_path, 100).split(30)
    publish_held_out(config.data_dir / "heldout", "words", held)
    items = heldout_items(config, {})
    nothing = await score_side(PlantedJudge(), items, ["x"] * len(items), FINE_CHAT,
                               lambda check, answer: None)  # e.g. no sandbox to run them in
    report = decide(nothing, nothing, SETTINGS, len(items))
    assert report.n == 0 and report.outcome == "inconclusive"
    assert f"{len(items)} were held out, and {len(items)} of them could not be scored" \
        in report.reasons[0]
