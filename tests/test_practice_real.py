"""/practice through the real llama.cpp server, the embedded model and the bwrap sandbox."""

from __future__ import annotations

import json

import pytest

from bot.commands import Caller, parse_command, run_command
from bot.runtime import Runtime
from core.config import Config

# Proves where it ran: only inside the sandbox is the workspace /workspace and the cwd.
WHERE_CHECK = """
import os
def reward(answer, workspace):
    return 0.5 if workspace == "/workspace" and os.getcwd() == "/workspace" else 0.0
"""


@pytest.mark.slow
async def test_practice_through_the_real_server_records_a_verdict_per_attempt(
        tmp_path, served_gguf, free_port):
    (tmp_path / "where.py").write_text(WHERE_CHECK)
    tasks = [{"id": "add", "prompt": "What is 2 plus 2? Answer with only the number.",
              "check": {"exact": "4"}},
             {"id": "file", "prompt": "Say hello.", "check": {"python": "where.py"}}]
    path = tmp_path / "real.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.model.gguf = served_gguf
    config.model.hf_dir = served_gguf.parent / "smollm2-135m-instruct-hf"
    config.server.port = free_port
    config.agent.max_steps = 2
    config.agent.tools = ["read_file", "write_file"]  # a short prompt: seconds, not minutes
    config.agent.max_reply_tokens = 32
    config.practice.held_out_percent = 0
    rt = await Runtime.start(config)
    try:
        name, options = parse_command(f"/practice {path} --samples 2")
        answer = await run_command(rt, Caller(0, (), "general", "console", local=True), name,
                                   **options)
        verdicts = await rt.store.events("verifier_reward")
        rewards = [e for e in verdicts if e["payload"]["reward"] is not None]
        unjudged = [e for e in verdicts if e["payload"]["reward"] is None]
        episodes = await rt.store.episodes_since(0)
    finally:
        await rt.close()
    assert "2 tasks x 2 samples" in answer.text, answer.text
    # A task none of whose attempts passed is shown its reference answer as one more
    # episode (practice.demonstrate); only "add" has one (its exact check's text).
    shown = [e for e in episodes if e.channel_id.endswith("-reference")]
    attempts = [e for e in episodes if e not in shown]
    assert len(attempts) == 4 and all(e.status in ("complete", "aborted") for e in attempts)
    assert unjudged == [], unjudged
    status = {e.id: e.status for e in attempts}
    by_task: dict[str, list[tuple[str, float]]] = {}
    for event in rewards:
        data = event["payload"]
        if event["episode_id"] not in status:
            assert data["check"] == "reference" and data["reward"] == 1.0, data
            continue
        assert data["group"] == f"real:{data['task_id']}:1"
        by_task.setdefault(data["task_id"], []).append((status[event["episode_id"]],
                                                        data["reward"]))
    assert sorted(by_task) == ["add", "file"] and all(len(v) == 2 for v in by_task.values())
    assert {r for _, r in by_task["add"]} <= {0.0, 1.0}
    add_passed = any(r == 1.0 for _, r in by_task["add"])
    assert [e.channel_id.startswith("practice-real-add") for e in shown] == (
        [] if add_passed else [True]), shown
    # The python check ran in the sandbox on each completed turn (0.5 says it saw
    # /workspace); a turn stopped by the step limit has no answer and scores 0.
    assert all(r == (0.5 if s == "complete" else 0.0) for s, r in by_task["file"])
