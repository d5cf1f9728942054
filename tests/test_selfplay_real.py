"""/selfplay through the real llama.cpp server, the embedded model and the bwrap sandbox.

The 135M model's proposals are whatever they are, so this asserts the harness,
whichever way the round goes: every proposal attempt is labelled and rewarded,
an invalid one gets its observation in the proposer channel, a valid one is
solved by both solvers and reported, and the run ends ``done``."""

from __future__ import annotations

import json

import pytest

from bot.commands import Caller, parse_command, run_command
from bot.runtime import Runtime
from bot.selfplay.proposal import proposer_reward
from core.config import Config
from serving.client import LLM
from serving.supervisor import ServerSupervisor
from tests.scripted import say


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


FOUR = "def reward(answer, workspace):\n    return 1.0 if '4' in answer else 0.0\n"


@pytest.mark.slow
async def test_real_solvers_on_a_valid_task_are_scored_in_the_sandbox_and_reported(
        tmp_path, served_gguf, free_port):
    """The proposer's first reply is canned (a valid task), so that the solver path runs
    through the real server whatever the model proposes; the solvers, the check in the
    sandbox and the proposer's reply to its report are real."""
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.model.gguf = served_gguf
    config.model.hf_dir = served_gguf.parent / "smollm2-135m-instruct-hf"
    config.server.port = free_port
    config.agent.max_steps = 2
    config.agent.tools = ["read_file", "write_file"]
    config.agent.max_reply_tokens = 32
    canned = json.dumps({"prompt": "What is 2 plus 2? Answer with only the number.",
                         "check": {"python": FOUR}, "reference": "4"})

    class CannedProposal:
        def __init__(self, real: LLM) -> None:
            self.real = real

        async def chat(self, messages, **kwargs):
            if messages[-1]["content"].startswith("Self-play round 1:"):
                return say(canned)
            return await self.real.chat(messages, **kwargs)

        async def close(self) -> None:
            await self.real.close()

    supervisor = ServerSupervisor(config)
    rt = await Runtime.start(config, supervisor=supervisor,
                             llm=CannedProposal(LLM(config, supervisor)))
    try:
        await run_command(rt, Caller(0, (), "general", "console", local=True),
                          "selfplay start", rounds=1, solvers=2)
        await rt.selfplay.join()
        rewards = [e["payload"] for e in await rt.store.events("verifier_reward")]
        history = await rt.store.channel_history("selfplay-1-proposer", 100)
        jobs = await rt.store.jobs("selfplay")
    finally:
        await rt.close()
        await rt.llm.close()
    assert jobs[0]["state"] == "done"
    solvers = [r for r in rewards if r["role"] == "solver"]
    proposer = [r for r in rewards if r["role"] == "proposer"]
    assert len(solvers) == 2 and all(s["check"] == "selfplay-python" for s in solvers)
    # The python check ran in the sandbox: 0 or 1 on a final answer, 0 for a stopped turn.
    assert all(s["reward"] in (0.0, 1.0) for s in solvers), solvers
    mean = sum(s["reward"] for s in solvers) / 2
    assert proposer == [proposer[0]] and proposer[0]["valid"]
    assert proposer[0]["reward"] == pytest.approx(proposer_reward(mean, 0.5, True))
    report = [s.content for s in history if s.role == "user" and s.content.startswith(
        "Self-play report, round 1")]
    assert report and f"mean reward {mean:.2f}" in report[0]
    assert any(s.role == "assistant" for s in history[-2:])  # the proposer answered it
