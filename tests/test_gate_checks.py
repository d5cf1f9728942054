"""The gate scores held-out python and regex checks in the real sandbox (bubblewrap):
a self-play task's reward function and pattern are the model's, so neither runs in
the trainer. Practice and self-play publish python items with their code."""

from __future__ import annotations

import json
import time

from bot.practice.runner import publish_held_out
from core.config import Config
from core.practice.sets import load_set
from tests.test_gate import FINE_CHAT, PlantedJudge
from trainer.gate_checks import SandboxScorer
from trainer.gate_items import heldout_items
from trainer.gate_side import score_side

FORTY_TWO = "def reward(answer, workspace):\n    return 1.0 if answer.strip() == '42' else 0.0\n"


def scorer(tmp_path, timeout_s: float = 10) -> SandboxScorer:
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.practice.check_timeout_s = timeout_s
    return SandboxScorer(config)


async def test_a_python_check_is_run_in_the_sandbox_on_the_answer(tmp_path):
    score = scorer(tmp_path)
    check = {"python": "forty_two.py", "code": FORTY_TWO}
    assert await score(check, " 42\n") == 1.0
    assert await score(check, "41") == 0.0
    # The code runs in the sandbox: the host's files are not there to read.
    secret = tmp_path / "host-secret.txt"
    secret.write_text("only on the host")
    peek = (f"import os\ndef reward(answer, workspace):\n"
            f"    return 1.0 if os.path.exists({str(secret)!r}) else 0.0\n")
    assert await score({"python": "peek.py", "code": peek}, "x") == 0.0
    assert score.failures == []


async def test_a_broken_looping_or_codeless_check_leaves_the_item_unscored(tmp_path):
    score = scorer(tmp_path, timeout_s=2)
    crash = "def reward(answer, workspace):\n    raise RuntimeError('boom')\n"
    assert await score({"python": "crash.py", "code": crash}, "42") is None
    started = time.monotonic()
    loop = "def reward(answer, workspace):\n    while True:\n        pass\n"
    assert await score({"python": "loop.py", "code": loop}, "42") is None
    assert time.monotonic() - started < 20
    assert await score({"python": "none.py"}, "42") is None
    assert await score({"python": "text.py", "code": "def reward(a, w):\n    return 'yes'\n"},
                       "42") is None
    assert "boom" in score.failures[0] and "timed out" in score.failures[1]
    assert "no code" in score.failures[2] and "not a number" in score.failures[3]


async def test_a_regex_is_searched_in_the_sandbox_and_a_backtracking_one_is_cut(tmp_path):
    score = scorer(tmp_path, timeout_s=2)
    assert await score({"regex": "b+c"}, "a bbbc here") == 1.0
    assert await score({"regex": r"\A\s*(?:4)\s*\Z"}, " 4 ") == 1.0
    assert await score({"regex": r"\A\s*(?:4)\s*\Z"}, "14") == 0.0
    started = time.monotonic()
    assert await score({"regex": "(a+)+$"}, "a" * 40 + "b") is None
    assert time.monotonic() - started < 20
    assert await score({"exact": "4"}, " 4 ") == 1.0  # string checks stay in the process


async def test_held_out_python_tasks_reach_the_gate_and_are_scored(tmp_path):
    (tmp_path / "forty_two.py").write_text(FORTY_TWO)
    tasks = [{"id": f"t{i}", "prompt": f"Question {i}?",
              "check": {"python": "forty_two.py"} if i % 2 else {"exact": "4"}}
             for i in range(6)]
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    publish_held_out(config.data_dir / "heldout", "set", list(load_set(path).tasks))
    items = heldout_items(config, {})
    assert [i.check.get("code") for i in items if "python" in i.check] == [FORTY_TWO] * 3
    answers = ["4", "42", "5", "41", "4", "42"]
    side = await score_side(PlantedJudge(), items, answers, FINE_CHAT, SandboxScorer(config))
    assert [side.scores[i.id] for i in items] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
