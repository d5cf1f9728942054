"""/selfplay through the real llama.cpp server, the embedded model and the bwrap sandbox.

The 135M model's proposals are whatever they are, so this asserts the harness,
whichever way the round goes: every proposal attempt is labelled and rewarded,
an invalid one gets its observation in the proposer channel, a valid one is
solved by both solvers and reported, and the run ends ``done``."""

from __future__ import annotations

import pytest

from bot.commands import Caller, parse_command, run_command
from bot.config import Config
from bot.runtime import Runtime


@pytest.mark.slow
async def test_a_selfplay_round_through_the_real_server(tmp_path, served_gguf, free_port):
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.model.gguf = served_gguf
    config.model.hf_dir = served_gguf.parent / "smollm2-135m-instruct-hf"
    config.server.port = free_port
    config.agent.max_steps = 2
    config.agent.tools = ["read_file", "write_file"]  # a short prompt: seconds, not minutes
    config.agent.max_reply_tokens = 96
    config.selfplay.max_tries = 2
    rt = await Runtime.start(config)
    try:
        name, options = parse_command("/selfplay start 1 --solvers 2")
        answer = await run_command(rt, Caller(0, (), "general", "console", local=True), name,
                                   **options)
        await rt.selfplay.join()
        rewards = await rt.store.events("verifier_reward")
        labels = [e["payload"] for e in await rt.store.events("selfplay")]
        history = await rt.store.channel_history("selfplay-1-proposer", 100)
        jobs = await rt.store.jobs("selfplay")
        episodes = await rt.store.episodes_since(0)
    finally:
        await rt.close()
    assert "Self-play #1 started" in answer.text, answer.text
    assert jobs[0]["state"] == "done", jobs
    proposals = [p for p in labels if p["role"] == "proposer" and p["step"] == "proposal"]
    proposer = [e["payload"] for e in rewards if e["payload"].get("role") == "proposer"]
    solvers = [e["payload"] for e in rewards if e["payload"].get("role") == "solver"]
    assert 1 <= len(proposals) <= 2 and len(proposer) == len(proposals)
    told = [s.content for s in history if s.role == "user"]
    invalid = [p for p in proposer if not p["valid"]]
    assert all(p["reward"] == 0.0 for p in invalid)
    # Each invalid proposal's reason was the proposer's next user message.
    observations = [t for t in told if t.startswith("Your proposal cannot be used")]
    assert len(observations) == len(invalid)
    for p, text in zip(invalid, observations):
        assert p["invalid"] in text
    if len(invalid) < len(proposer):  # a valid task: both solvers ran, the proposer saw the report
        assert len(solvers) == 2 and all(s["reward"] is None or 0 <= s["reward"] <= 1
                                         for s in solvers)
        assert any(t.startswith("Self-play report, round 1") for t in told)
    else:
        assert solvers == [] and len(invalid) == 2
    assert all(e.status in ("complete", "aborted") for e in episodes), \
        [(e.channel_id, e.status) for e in episodes]
