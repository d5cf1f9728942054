"""Self-play through the runtime: a scripted model proposes and solves, the real store,
tools and sandbox run the checks, and every trajectory's role, round and reward is stored."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

import pytest

from bot.commands import Caller, parse_command, run_command
from bot.runtime import Runtime
from bot.selfplay.proposal import proposer_reward
from bot.selfplay.round import PROPOSER_SECTION
from bot.selfplay.runs import SelfPlay
from core.config import Config
from core.practice.sets import load_set
from tests.scripted import ScriptedLLM, say
from tests.test_channels import FakeServer

ADMIN = Caller(0, (), "general", "console", local=True)
ANSWER_42 = ("def reward(answer, workspace):\n"
             "    return 1.0 if answer.strip() == '42' else 0.0\n")
# Unjudged on any wrong answer but the dummy: it crashes, or loops until its timeout.
CRASHES = ("def reward(answer, workspace):\n"
           "    if answer.strip() == '42': return 1.0\n"
           "    if answer.strip() == \"I don't know.\": return 0.0\n"
           "    raise ValueError('boom: cannot score ' + answer)\n")
LOOPS = CRASHES.replace("    raise ValueError('boom: cannot score ' + answer)\n",
                        "    while True: pass\n")
TASK = "What is 6 times 7? Answer with only the number."


def proposal(check: dict, reference: str = "42", prompt: str = TASK) -> str:
    return "Here is my task:\n```json\n" + json.dumps(
        {"prompt": prompt, "check": check, "reference": reference}) + "\n```"


class Script:
    """The proposer says ``proposals`` in turn (then "noted" to reports); solver k answers
    ``answers[k % len]`` in the order solvers ask. Records what the proposer was told."""

    def __init__(self, proposals: list[str], answers: list[str], rt_box: list | None = None):
        self.proposals, self.answers, self.solved = list(proposals), answers, 0
        self.told: list[str] = []
        self.busy: list[list[str]] = []
        self.rt_box = rt_box

    def __call__(self, messages, kwargs):
        if self.rt_box:
            self.busy.append(self.rt_box[0].rounds.names())
        last = messages[-1]["content"]
        if PROPOSER_SECTION in messages[0]["content"]:
            self.told.append(last)
            if last.startswith("Self-play report") or not self.proposals:
                return say("noted")
            return say(self.proposals.pop(0))
        assert last == TASK or last.startswith("What is"), last
        answer = self.answers[self.solved % len(self.answers)]
        self.solved += 1
        return say(answer)


async def start(tmp_path, script, **settings) -> tuple[Runtime, ScriptedLLM]:
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.practice.held_out_percent = settings.pop("held_out_percent", 0)
    config.practice.check_timeout_s = settings.pop("check_timeout_s", 10)
    for key, value in settings.items():
        setattr(config.selfplay, key, value)
    llm = ScriptedLLM(script)
    rt = await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"), llm=llm,
                             start_server=False)
    return rt, llm


async def play(rt: Runtime, line: str) -> tuple[str, list[tuple[str, str]]]:
    said: list[tuple[str, str]] = []

    async def listen(channel: str, text: str) -> None:
        said.append((channel, text))

    rt.announcers.append(listen)
    name, options = parse_command(line)
    answer = await run_command(rt, ADMIN, name, **options)
    await rt.selfplay.join()
    return answer.text, said


def by_role(events: list[dict], role: str) -> list[dict]:
    return [e["payload"] for e in events if e["payload"].get("role") == role]


async def test_a_round_proposes_validates_solves_reports_and_rewards(tmp_path):
    box: list = []
    script = Script(["I think a good task is arithmetic.",  # no JSON: invalid, told why
                     proposal({"python": ANSWER_42})], ["42", "41", "42", "6*7"], box)
    rt, llm = await start(tmp_path, script)
    box.append(rt)
    try:
        answer, said = await play(rt, "/selfplay start 1 --solvers 4")
        rewards = await rt.store.events("verifier_reward")
        labels = await rt.store.events("selfplay")
        history = await rt.store.channel_history("selfplay-1-proposer", 50)
        jobs = await rt.store.jobs("selfplay")
        busy_after = rt.rounds.busy
    finally:
        await rt.close()
    assert "Self-play #1 started: 1 round(s), 4 solver(s)" in answer
    # The invalid proposal's observation is the next user message of the proposer channel.
    assert script.told[1].startswith("Your proposal cannot be used: I found no JSON object")
    assert "2 tries left" in script.told[1]
    proposer = by_role(rewards, "proposer")
    assert [(p["reward"], p["valid"]) for p in proposer] == [(0.0, False), (1.0, True)]
    assert all(p["check"] == "selfplay-proposer" and p["round"] == 1 for p in proposer)
    solvers = by_role(rewards, "solver")
    assert sorted(s["reward"] for s in solvers) == [0.0, 0.0, 1.0, 1.0]
    assert len({s["group"] for s in solvers}) == 1 and solvers[0]["check"] == "selfplay-python"
    # Each trajectory is labelled with its role and round; each solver had a fresh channel.
    steps = [(p["role"], p["step"], p["try"]) for p in (e["payload"] for e in labels)]
    assert steps.count(("proposer", "proposal", 1)) == 1
    assert steps.count(("proposer", "proposal", 2)) == 1
    assert steps.count(("solver", "attempt", 1)) == 4 and ("proposer", "report", 2) in steps
    solver_channels = {e["channel_id"] for e in labels if e["payload"]["role"] == "solver"}
    assert solver_channels == {f"selfplay-1-r1-s{k}" for k in range(4)}
    # The report is in the proposer's channel history: the proposer saw it.
    report = [s.content for s in history if s.role == "user" and "report" in s.content]
    assert report and "mean reward 0.50, spread 0.50" in report[0] and "reward: 1.00" in report[0]
    # The middling task is kept as a practice set with its check file.
    kept = load_set(rt.config.data_dir / "practice" / "selfplay.jsonl")
    assert [t.prompt for t in kept.tasks] == [TASK] and kept.tasks[0].check.kind == "python"
    assert jobs[0]["state"] == "done" and jobs[0]["progress"]["kept"] == 1
    assert all("selfplay #1" in names for names in script.busy) and not busy_after
    assert any("round 1: task sp-" in text and "kept" in text for _, text in said)
    assert said[-1][0] == "general" and "1 valid task(s)" in said[-1][1]


async def test_a_kept_task_in_the_held_out_share_is_published_and_never_trained_on(tmp_path):
    prompt = next(p for p in (f"What is 6 times 7? (variant {i})" for i in range(50))
                  if _held_out(p))
    # Round 1 finds it middling and keeps it; round 2 finds it easy: still the gate's item.
    script = Script([proposal({"exact": "42"}, prompt=prompt)] * 2, ["42", "41", "42", "42"])
    rt, _ = await start(tmp_path, script, held_out_percent=90)
    try:
        await play(rt, "/selfplay start 2 --solvers 2")
        rewards = await rt.store.events("verifier_reward")
    finally:
        await rt.close()
    solvers = by_role(rewards, "solver")
    assert [s["reward"] for s in solvers] == [None] * 4
    assert all("held out for the gate" in s["error"] for s in solvers)
    # The mean still rewards the proposer: 0.5 at round 1, 1.0 at round 2.
    assert [p["reward"] for p in by_role(rewards, "proposer")] == [1.0, pytest.approx(0.2)]
    published = (rt.config.data_dir / "heldout" / "selfplay.jsonl").read_text().splitlines()
    assert [json.loads(line)["prompt"] for line in published] == [prompt]


def _held_out(prompt: str) -> bool:
    from core.practice.sets import is_held_out
    from bot.selfplay.proposal import parse_proposal

    return is_held_out(parse_proposal(proposal({"exact": "42"}, prompt=prompt)).id, 90)


@pytest.mark.parametrize("check,why", [(CRASHES, "crashed"), (LOOPS, "timed out after 2 s")])
async def test_a_crashing_or_looping_check_leaves_the_attempt_unjudged(tmp_path, check, why):
    script = Script([proposal({"python": check})], ["42", "41"])
    rt, _ = await start(tmp_path, script, check_timeout_s=2)
    try:
        await play(rt, "/selfplay start 1 --solvers 2")
        rewards = await rt.store.events("verifier_reward")
    finally:
        await rt.close()
    solvers = sorted(by_role(rewards, "solver"), key=lambda s: s["reward"] is None)
    assert solvers[0]["reward"] == 1.0  # the right answer was judged
    assert solvers[1]["reward"] is None and why in solvers[1]["error"]  # never 0 by accident
    # One judged attempt: the mean is 1, the task is not middling, the proposer gets the floor.
    assert by_role(rewards, "proposer")[0]["reward"] == pytest.approx(0.2)


@pytest.mark.parametrize("bad,observation", [
    (proposal({"python": "def reward(answer, workspace):\n    raise KeyError('x')\n"}),
     "on a dummy answer (\"I don't know.\") the python check crashed"),
    (proposal({"python": "def reward(answer, workspace):\n    while True: pass\n"}),
     "on a dummy answer (\"I don't know.\") the python check timed out"),
    (proposal({"python": "def reward(answer, workspace):\n    return 'yes'\n"}),
     "reward() returned str, not a number"),
    (proposal({"python": "def reward(answer, workspace):\n    return 1.0\n"}),
     "the check gives 1 to a dummy answer"),
    (proposal({"exact": "42"}, reference="41"), "your reference answer '41' gets 0"),
    (proposal({"exact": "42"}, reference=""), "the \"reference\" answer is missing"),
    ('{"prompt": "x", "check": {"shell": "true"}, "reference": "y"}', "the \"check\" must be"),
])
async def test_an_invalid_proposal_gets_its_observation_and_the_lowest_reward(
        tmp_path, bad, observation):
    script = Script([bad, bad], ["42"])
    rt, _ = await start(tmp_path, script, max_tries=2, check_timeout_s=2)
    try:
        _, said = await play(rt, "/selfplay start")
        rewards = await rt.store.events("verifier_reward")
        labels = await rt.store.events("selfplay")
    finally:
        await rt.close()
    told = [t for t in script.told if t.startswith("Your proposal cannot be used")]
    assert len(told) == 2 and observation in told[0], told[0]
    assert "1 try left" in told[0] and "No tries are left" in told[1]
    assert [(p["reward"], p["valid"]) for p in by_role(rewards, "proposer")] == [(0.0, False)] * 2
    assert by_role(rewards, "solver") == []  # no solver ran on an invalid task
    assert not any(e["payload"]["role"] == "solver" for e in labels)
    assert any("no valid task after 2 tries" in text for _, text in said)


def test_the_proposer_reward_peaks_at_the_target():
    assert proposer_reward(0.5, 0.5, True) == 1.0
    assert proposer_reward(0.0, 0.5, True) == proposer_reward(1.0, 0.5, True) == pytest.approx(0.2)
    assert proposer_reward(0.25, 0.5, True) == pytest.approx(0.6)
    assert proposer_reward(0.0, 0.0, True) == 1.0 and proposer_reward(1.0, 0.0, True) == 0.2
    assert proposer_reward(1.0, 1.0, True) == 1.0 and proposer_reward(0.0, 1.0, True) == 0.2
    assert proposer_reward(0.5, 0.0, True) == pytest.approx(0.6)
    for target in (0.0, 0.5, 1.0):
        assert proposer_reward(target, target, False) == 0.0  # invalid: the lowest
        assert proposer_reward(None, target, True) is None  # nothing judged: unjudged
        assert min(proposer_reward(m / 10, target, True) for m in range(11)) > 0.0


async def test_selfplay_is_for_admins_and_stop_ends_a_run(tmp_path):
    release = asyncio.Event()

    class Blocking(ScriptedLLM):
        async def chat(self, messages, **kwargs):
            await release.wait()
            return say("never")

    config = Config()
    config.paths.data_dir = tmp_path / "data"
    rt = await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"),
                             llm=Blocking([]), start_server=False)
    try:
        refused = await run_command(rt, Caller(5, (), "general", "someone"), "selfplay start")
        bad = await run_command(rt, ADMIN, "selfplay start", rounds=0)
        started = await run_command(rt, ADMIN, "selfplay start", rounds=3)
        again = await run_command(rt, ADMIN, "selfplay start")
        await asyncio.sleep(0.2)
        busy = rt.rounds.names()
        stopped = await run_command(rt, ADMIN, "selfplay stop")
        jobs = await rt.store.jobs("selfplay")
        idle = await run_command(rt, ADMIN, "selfplay stop")
    finally:
        await rt.close()
    assert refused.refused and "ROUNDS must be between 1 and 100" in bad.text
    assert "Self-play #1 started: 3 round(s)" in started.text
    assert "already running" in again.text and busy == ["selfplay #1"]
    assert "Self-play #1 stopped" in stopped.text and jobs[0]["state"] == "cancelled"
    assert idle.text == "No self-play is running." and not rt.rounds.busy


async def test_the_daily_schedule_starts_once_a_day_and_skips_a_missed_time(tmp_path):
    now = [datetime(2026, 3, 2, 13, 0, tzinfo=timezone.utc)]
    script = Script([], ["42"])  # the proposer answers "noted": invalid, quickly
    rt, _ = await start(tmp_path, script, daily="14:00", max_tries=1)
    try:
        daily = SelfPlay(rt.practice, clock=lambda: now[0])
        first = await daily.tick()  # 13:00: today's 14:00 has not come
        now[0] = now[0].replace(hour=14, minute=5)
        second = await daily.tick()
        await daily.join()
        now[0] = now[0].replace(hour=23)
        third = await daily.tick()  # the same day: done already
        now[0] = datetime(2026, 3, 5, 9, 0, tzinfo=timezone.utc)  # two missed days later
        fourth = await daily.tick()  # yesterday's 14:00 passed unseen: not made up twice
        await daily.join()
        jobs = await rt.store.jobs("selfplay")
    finally:
        await rt.close()
    assert first is None and third is None
    assert second.startswith("Self-play #1 started") and fourth.startswith("Self-play #2 started")
    assert [j["state"] for j in jobs] == ["done", "done"]


def test_a_proposal_is_read_leniently_from_the_models_reply():
    from bot.selfplay.proposal import ProposalError, parse_proposal

    bare = parse_proposal('Sure! {"task": "Add 2 and 3.", "check": {"exact": "5"}, '
                          '"answer": 5} Hope it helps {not json')
    assert (bare.prompt, bare.check.kind, bare.check.value, bare.reference) == \
        ("Add 2 and 3.", "exact", "5", "5")
    fenced = parse_proposal('{"prompt": "Say 42.", "reference": "42"}\n```python\n'
                            + ANSWER_42 + "```")
    assert fenced.check.kind == "python" and fenced.check.code == ANSWER_42
    inline = parse_proposal(json.dumps({"question": "Say 42.", "check": ANSWER_42,
                                        "solution": "42"}))
    assert inline.check.code == ANSWER_42 and inline.id == fenced.id  # same task, same id
    assert inline.set_check() == {"python": f"selfplay/{inline.id}.py"}
    for reply, why in [("", "no JSON object"), ('{"prompt": ""}', "empty"),
                       ('{"prompt": "p", "check": {"exact": "1"}}', "reference"),
                       ('{"prompt": "p", "reference": "1"}', "the \"check\" must be"),
                       ('{"prompt": "p", "check": {"python": "x = 1"}, "reference": "1"}',
                        "must define reward"),
                       ("{" * 100_000, "no JSON object"),
                       ('{"prompt": ' + "[" * 19_000, "no JSON object")]:
        with pytest.raises(ProposalError, match=why):
            parse_proposal(reply)


async def test_a_practice_run_is_a_round_in_progress_too(tmp_path):
    """A due night waits for practice as for self-play: the run registers while it runs."""
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"id": "add", "prompt": "2+2?", "check": {"exact": "4"}}) + "\n")
    seen: list[list[str]] = []
    box: list[Runtime] = []

    def script(messages, kwargs):
        seen.append(box[0].rounds.names())
        return say("4")

    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.practice.held_out_percent = 0
    rt = await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"),
                             llm=ScriptedLLM(script), start_server=False)
    box.append(rt)
    try:
        await run_command(rt, ADMIN, "practice", file=str(path), samples=2)
        after = rt.rounds.busy
    finally:
        await rt.close()
    assert seen == [["practice #1"]] * 2 and not after


async def test_no_sandbox_ends_the_round_without_blaming_the_proposer(tmp_path):
    from sandbox.process import SandboxUnavailable

    script = Script([proposal({"python": ANSWER_42})], ["42"])
    rt, _ = await start(tmp_path, script)

    async def unavailable(*args, **kwargs):
        raise SandboxUnavailable("bubblewrap is not installed")

    rt.spaces.services.sandbox.run = unavailable
    try:
        _, said = await play(rt, "/selfplay start 1 --solvers 2")
        rewards = await rt.store.events("verifier_reward")
    finally:
        await rt.close()
    proposer = by_role(rewards, "proposer")
    assert [(p["reward"], p["valid"]) for p in proposer] == [(None, True)]
    assert "bubblewrap is not installed" in proposer[0]["error"]
    assert by_role(rewards, "solver") == [] and len(script.told) == 1  # no observation sent
    assert any("no valid task after 1 tries (the check cannot run" in t for _, t in said)


async def test_a_proposer_stopped_by_the_step_limit_is_told_so(tmp_path):
    from tests.scripted import call

    def script(messages, kwargs):
        if messages[-1]["role"] == "user" and messages[-1]["content"].startswith("Your proposal"):
            return say("ok")
        return call("list_dir", {"path": "."})

    rt, llm = await start(tmp_path, script, max_tries=1)
    rt.config.agent.max_steps = 2  # the practice agent copies the config when a run starts
    try:
        await play(rt, "/selfplay start")
        rewards = await rt.store.events("verifier_reward")
    finally:
        await rt.close()
    told = [m[-1]["content"] for m, _ in llm.calls if m[-1]["role"] == "user"]
    assert told[-1].startswith("Your proposal cannot be used: your turn stopped at a limit")
    assert [(p["reward"], p["valid"]) for p in by_role(rewards, "proposer")] == [(0.0, False)]
