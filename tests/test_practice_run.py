"""/practice through the runtime: a scripted model answers, the real tools, store and
sandbox run, and each attempt's verdict is stored as a verifier event on its episode."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bot.commands import Caller, parse_command, run_command
from bot.runtime import Runtime
from core.config import Config
from core.practice.sets import is_held_out
from tests.scripted import ScriptedLLM, call, say
from tests.test_channels import FakeServer

FILE_CHECK = """
from pathlib import Path
def reward(answer, workspace):
    path = Path(workspace) / "answer.txt"
    return 1.0 if path.is_file() and path.read_text().strip() == "42" else 0.0
"""
CRASH_CHECK = "def reward(answer, workspace):\n    raise ValueError('bad check')\n"


def practice_set(tmp_path: Path) -> Path:
    (tmp_path / "file_check.py").write_text(FILE_CHECK)
    (tmp_path / "crash_check.py").write_text(CRASH_CHECK)
    tasks = [
        {"id": "add", "prompt": "What is 2 plus 3?", "check": {"exact": "5"}},
        {"id": "sub", "prompt": "What is 9 minus 2?", "check": {"exact": "7"}},
        {"id": "file", "prompt": "Write 42 to answer.txt", "check": {"python": "file_check.py"}},
        {"id": "crash", "prompt": "Say hi", "check": {"python": "crash_check.py"}},
        {"id": "held-2", "prompt": "What is 1 plus 1?", "check": {"regex": "2"}},
    ]
    path = tmp_path / "drill.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def script(messages, kwargs):
    """Right on "add" and "file", wrong on "sub"; the sampled temperature is recorded."""
    last = messages[-1]
    if last["role"] == "tool":
        return say("done")
    prompt = last["content"]
    if prompt.startswith("Write 42"):
        return call("write_file", {"path": "answer.txt", "content": "42"})
    if "held" in prompt or "1 plus 1" in prompt:
        raise AssertionError("a held-out task was practised")
    return say({"What is 2 plus 3?": "5", "What is 9 minus 2?": "6"}.get(prompt, "hi"))


async def test_practice_runs_each_task_g_times_and_records_verifier_rewards(tmp_path):
    assert is_held_out("held-2") and not any(is_held_out(t) for t in ("add", "sub", "file",
                                                                      "crash"))
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.practice.temperature = 0.9
    llm = ScriptedLLM(script)
    rt = await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"), llm=llm,
                             start_server=False)
    lines: list[str] = []

    async def listen(line: str) -> None:
        lines.append(line)

    rt.practice.listeners.append(listen)
    try:
        name, options = parse_command(f"/practice {practice_set(tmp_path)} --samples 3")
        answer = await run_command(rt, Caller(0, (), "general", "console", local=True), name,
                                   **options)
        verdicts = await rt.store.events("verifier_reward")
        shown = [e for e in verdicts if e["payload"].get("demonstration")]
        rewards = [e for e in verdicts if e["payload"]["reward"] is not None and e not in shown]
        unjudged = [e for e in verdicts if e["payload"]["reward"] is None]
        episodes = {e.id: e for e in await rt.store.episodes_since(0)}
        jobs = await rt.store.jobs("practice")
    finally:
        await rt.close()
    assert "4 tasks x 3 samples (1 held out" in answer.text, answer.text
    # One held-out item: the gate could not decide on it, and the summary says what to do.
    assert "The gate needs at least 20 held-out items to decide and the practice sets hold " \
           "out 1: it needs 19 more" in answer.text
    assert "Mean reward 0.67 over 9 judged attempts (0 stopped by a limit before a final " \
           "answer); 3 unjudged" in answer.text
    # Every model call of a practice turn was sampled at the practice temperature.
    assert {kwargs["temperature"] for _, kwargs in llm.calls} == {0.9}
    by_task: dict[str, list[float]] = {}
    for event in rewards:
        data = event["payload"]
        assert set(data) == {"reward", "task", "task_id", "set", "check", "group"}
        assert data["set"] == "drill" and data["group"] == f"drill:{data['task_id']}:{jobs[0]['id']}"
        episode = episodes[event["episode_id"]]
        assert event["channel_id"] == episode.channel_id
        assert episode.channel_id.startswith(f"practice-drill-{data['task_id']}-")
        by_task.setdefault(data["task_id"], []).append(data["reward"])
    assert by_task == {"add": [1.0] * 3, "sub": [0.0] * 3, "file": [1.0] * 3}
    assert {e["payload"]["check"] for e in rewards} == {"exact", "python"}
    assert len(unjudged) == 3
    assert all(e["payload"]["task_id"] == "crash" and "bad check" in e["payload"]["why"]
               for e in unjudged)
    # "sub" was never passed: its exact answer joined its group as an example, in a fresh
    # channel with the agent's own context; "crash" has no reference and got none.
    assert [e["payload"]["task_id"] for e in shown] == ["sub"]
    assert shown[0]["payload"]["reward"] == 1.0 and shown[0]["payload"]["check"] == "reference"
    assert shown[0]["payload"]["group"] == f"drill:sub:{jobs[0]['id']}"
    example = episodes[shown[0]["episode_id"]]
    assert example.status == "complete" and example.channel_id.endswith("-reference")
    assert [s.role for s in example.steps] == ["system", "user", "assistant"]
    assert example.steps[-1].content == "7" and example.steps[-1].meta["demonstration"]
    assert example.steps[0].meta["tools_ref"]
    # Under the default (function-calling) format the answer counts as the choice of words.
    assert example.steps[-1].meta["choice"] == "message"
    assert "1 shown by example" in lines[-1]
    # Twelve fresh channels, one episode each: no attempt saw another's history.
    assert len({e.channel_id for e in episodes.values()}) == len(episodes) == 13
    assert jobs[0]["state"] == "done" and jobs[0]["args"]["held_out"] == ["held-2"]
    # The held-out task is published where the night's gate reads its items.
    published = (config.data_dir / "heldout" / "drill.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in published] == ["held-2"]
    assert jobs[0]["progress"]["tasks_done"] == 4 and jobs[0]["progress"]["judged"] == 9
    assert len(lines) == 4 and re.match(r"practice #\d+: 4/4 tasks, mean reward 0\.67", lines[-1])


async def test_a_bad_practice_file_is_refused_with_its_line_and_nothing_runs(tmp_path):
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "prompt": "p", "check": {"exact": "1"}}\n{"id": "b"\n')
    llm = ScriptedLLM([])
    rt = await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"), llm=llm,
                             start_server=False)
    try:
        caller = Caller(0, (), "general", "console", local=True)
        answer = await run_command(rt, caller, "practice", file=str(path))
        too_many = await run_command(rt, caller, "practice", file=str(path), samples=0)
        jobs = await rt.store.jobs("practice")
    finally:
        await rt.close()
    assert "bad.jsonl:2: not valid JSON" in answer.text and "usage: /practice" in answer.text
    assert "--samples must be between 1 and 64" in too_many.text
    assert llm.calls == [] and jobs == []


async def test_practice_is_for_admins_only(tmp_path):
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    rt = await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"),
                             llm=ScriptedLLM([]), start_server=False)
    try:
        answer = await run_command(rt, Caller(5, (), "general", "someone"), "practice",
                                   file=str(practice_set(tmp_path)))
    finally:
        await rt.close()
    assert answer.refused


async def test_a_turn_stopped_by_the_step_limit_scores_0_and_a_server_failure_is_unjudged(
        tmp_path):
    from serving.client import LLMError

    (tmp_path / "always.py").write_text("def reward(answer, workspace):\n    return 1.0\n")
    tasks = [{"id": "add", "prompt": "loop", "check": {"python": "always.py"}},
             {"id": "file", "prompt": "down", "check": {"exact": "x"}}]
    path = tmp_path / "limits.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))

    def looping(messages, kwargs):
        if messages[1]["content"] == "down":
            raise LLMError("the server is down", attempts=1)
        return call("list_dir", {"path": "."})

    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.agent.max_steps = 2
    rt = await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"),
                             llm=ScriptedLLM(looping), start_server=False)
    try:
        answer = await run_command(rt, Caller(0, (), "general", "console", local=True),
                                   "practice", file=str(path), samples=2)
        verdicts = await rt.store.events("verifier_reward")
        rewards = [e for e in verdicts if e["payload"]["reward"] is not None]
        unjudged = [e for e in verdicts if e["payload"]["reward"] is None]
    finally:
        await rt.close()
    # The python check would give 1.0: it must not run on a turn with no final answer.
    assert [(e["payload"]["task_id"], e["payload"]["reward"]) for e in rewards] == [("add", 0.0)] * 2
    assert "2 stopped by a limit" in answer.text
    assert [e["payload"]["task_id"] for e in unjudged] == ["file", "file"]
    assert all("the turn ended errored" in e["payload"]["why"] for e in unjudged)


WROTE_CHECK = """
from pathlib import Path
def reward(answer, workspace):
    path = Path(workspace) / "notes" / "plan.txt"
    return 1.0 if path.is_file() and path.read_text().strip() == "ship it" else 0.0
"""


async def test_a_reference_with_tool_calls_is_run_and_recorded_as_the_agents_own_calls(tmp_path):
    (tmp_path / "wrote.py").write_text(WROTE_CHECK)
    calls = [{"name": "write_file", "arguments": {"path": "notes/plan.txt", "content": "ship it"}}]
    tasks = [
        {"id": "plan", "prompt": "Save 'ship it' to notes/plan.txt",
         "check": {"python": "wrote.py"}, "reference": {"calls": calls, "answer": "Saved."}},
        # A tool the agent is not offered would teach a call it never sees: not shown.
        {"id": "git", "prompt": "Commit the plan", "check": {"python": "wrote.py"},
         "reference": {"calls": [{"name": "git_commit", "arguments": {"message": "m"}}],
                       "answer": "Committed."}},
        # Calls whose result fails the check are not shown either.
        {"id": "wrong", "prompt": "Save it elsewhere", "check": {"python": "wrote.py"},
         "reference": {"calls": [{"name": "write_file", "arguments": {
             "path": "other.txt", "content": "ship it"}}], "answer": "Saved."}},
    ]
    path = tmp_path / "tools.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.agent.tools = ["read_file", "write_file", "list_dir"]
    config.practice.held_out_percent = 0
    rt = await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"),
                             llm=ScriptedLLM(lambda messages, kwargs: say("I can't.")),
                             start_server=False)
    try:
        name, options = parse_command(f"/practice {path} --samples 2")
        answer = await run_command(rt, Caller(0, (), "general", "console", local=True), name,
                                   **options)
        shown = [e for e in await rt.store.events("verifier_reward")
                 if e["payload"].get("demonstration")]
        episodes = {e.id: e for e in await rt.store.episodes_since(0)}
        workspace = rt.spaces.context(shown[0]["channel_id"]).workspace if shown else None
    finally:
        await rt.close()
    assert "Mean reward 0.00 over 6 judged attempts" in answer.text, answer.text
    assert [e["payload"]["task_id"] for e in shown] == ["plan"]
    example = episodes[shown[0]["episode_id"]]
    assert [s.role for s in example.steps] == ["system", "user", "assistant", "tool", "assistant"]
    call_step, tool_step, final = example.steps[2:]
    assert call_step.meta["demonstration"] and final.meta["demonstration"]
    assert json.loads(call_step.tool_calls[0]["function"]["arguments"]) == calls[0]["arguments"]
    assert call_step.tool_calls[0]["function"]["name"] == "write_file"
    # The observation is the real tool's output, and the file is really there.
    assert tool_step.tool_call_id == call_step.tool_calls[0]["id"]
    assert "notes/plan.txt" in tool_step.content and tool_step.meta["ok"]
    assert (workspace.root / "notes/plan.txt").read_text() == "ship it"
    assert final.content == "Saved." and final.meta["choice"] == "message"
    # Each step records the exact context the night renders (core.storage.prefixes).
    assert call_step.meta["context"]["tail"] == 1 and final.meta["context"]["tail"] == 3


async def test_a_practice_attempt_stops_at_the_practice_step_limit(tmp_path):
    """A looping attempt ends at practice.max_steps, not the agent's limit for people's
    turns; it is stored as stopped by a limit, and its check still judges it."""
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.practice.max_steps = 3
    assert config.agent.max_steps == 8
    llm = ScriptedLLM(lambda messages, kwargs: call("list_dir", {"path": "."}))
    path = tmp_path / "loop.jsonl"
    path.write_text(json.dumps({"id": "add", "prompt": "What is 2 plus 3?",
                                "check": {"exact": "5"}}) + "\n")
    rt = await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"), llm=llm,
                             start_server=False)
    try:
        name, options = parse_command(f"/practice {path} --samples 2")
        answer = await run_command(rt, Caller(0, (), "general", "console", local=True), name,
                                   **options)
        attempts = [e for e in await rt.store.episodes_since(0)
                    if not e.channel_id.endswith("-reference")]
    finally:
        await rt.close()
    assert "2 stopped by a limit" in answer.text, answer.text
    assert len(attempts) == 2 and {e.status for e in attempts} == {"aborted"}
    for episode in attempts:
        assert sum(1 for s in episode.steps if s.role == "assistant") == 3


class AnswersFromATable:
    """A scripted agent: no model, no tools; each turn is an episode in the store."""

    def __init__(self, store, answers: dict[str, str], temperature: float) -> None:
        self.store, self.answers, self.temperature = store, answers, temperature

    async def turn(self, channel: str, text: str, speaker: str = "user"):
        from bot.agent.loop import TurnResult
        from core.storage.schema import Step

        reply = self.answers[text]
        episode, _ = await self.store.start_turn(channel, None, [Step("user", text, name=speaker)])
        await self.store.add_step(episode, Step("assistant", reply))
        await self.store.end_episode(episode, "complete")
        return TurnResult(channel, reply, episode, ok=True, steps=1)


async def test_a_practice_run_needs_only_a_store_and_an_agent_not_the_runtime(tmp_path):
    """Practice takes its services (bot.practice.services), so it runs without a model
    server, tools or front end: the verdicts reach the store as the night reads them."""
    from bot.practice.runner import run_practice
    from bot.practice.services import PracticeServices
    from core.storage.events import Event
    from core.storage.store import Store
    from sandbox.paths import Workspace
    from tools import ToolContext

    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.practice.held_out_percent = 0
    config.practice.temperature = 0.7
    config.practice.demonstrate = False  # a demonstration is a turn of the real agent
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in (
        {"id": "a", "prompt": "2 plus 3?", "check": {"exact": "5"}},
        {"id": "b", "prompt": "9 minus 2?", "check": {"exact": "7"}})))
    store = await Store.open(tmp_path / "store.db")
    made = []

    def make_agent(cfg):
        made.append(AnswersFromATable(store, {"2 plus 3?": "5", "9 minus 2?": "6"},
                                      cfg.agent.temperature))
        return made[-1]

    lines = []

    async def listen(line):
        lines.append(line)

    def context(channel):  # exact checks read the answer alone: no sandbox is needed
        return ToolContext.open(channel, Workspace(tmp_path / "ws" / channel),
                                tmp_path / "state" / channel, sandbox=None)

    services = PracticeServices(config, store, make_agent, context, listeners=[listen])
    try:
        summary = await run_practice(services, path, samples=2)
        events = await store.events(Event.VERIFIER_REWARD)
    finally:
        await store.close()
    assert [a.temperature for a in made] == [0.7]  # one agent, at the practice temperature
    rewards = sorted((e["payload"]["task"], e["payload"]["reward"]) for e in events)
    assert rewards == [("a", 1.0), ("a", 1.0), ("b", 0.0), ("b", 0.0)]
    assert {e["payload"]["group"] for e in events} == {"sums:a:1", "sums:b:1"}
    assert "Mean reward 0.50 over 4 judged attempts" in summary and len(lines) == 2


async def practise(tmp_path: Path, tasks: list[dict], script, samples: int,
                   mixed_samples: int) -> tuple[str, list[dict], dict]:
    """Practise ``tasks`` (none held out) with ``mixed_samples``: the summary, the verdict
    events and the job row."""
    path = tmp_path / "drill.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.practice.held_out_percent = 0
    config.practice.mixed_samples = mixed_samples
    rt = await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"),
                             llm=ScriptedLLM(script), start_server=False)
    try:
        answer = await run_command(rt, Caller(0, (), "general", "console", local=True),
                                   "practice", file=str(path), samples=samples)
        verdicts = await rt.store.events("verifier_reward")
        (job,) = await rt.store.jobs("practice")
    finally:
        await rt.close()
    return answer.text, verdicts, job


async def test_a_task_whose_attempts_disagree_gets_more_and_one_that_agrees_does_not(tmp_path):
    # "mixed" is answered right on every other call, "steady" always wrong: only the group
    # that holds both a pass and a failure is worth more attempts (practice.mixed_samples).
    tasks = [{"id": "mixed", "prompt": "What is 2 plus 3?", "check": {"exact": "5"}},
             {"id": "steady", "prompt": "What is 9 minus 2?", "check": {"exact": "7"}}]
    asked = {"mixed": 0}

    def alternating(messages, kwargs):
        if messages[-1]["content"] == "What is 2 plus 3?":
            asked["mixed"] += 1
            return say("5" if asked["mixed"] % 2 else "4")
        return say("6")

    answer, verdicts, job = await practise(tmp_path, tasks, alternating, 2, 6)
    attempts: dict[str, list[float]] = {}
    for event in verdicts:
        if not event["payload"].get("demonstration"):
            attempts.setdefault(event["payload"]["task_id"], []).append(event["payload"]["reward"])
    assert sorted(attempts["mixed"]) == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert attempts["steady"] == [0.0, 0.0]
    # The six attempts are one group, in six fresh channels: their mean is one baseline.
    groups = {e["payload"]["group"] for e in verdicts if e["payload"]["task_id"] == "mixed"}
    channels = {e["channel_id"] for e in verdicts if e["payload"]["task_id"] == "mixed"}
    assert len(groups) == 1 and {c.rsplit("-", 1)[1] for c in channels} == set("012345")
    assert "1 tasks whose first attempts disagreed got 6 in all" in answer, answer
    assert job["progress"]["topped_up"] == 1 and job["args"]["mixed_samples"] == 6


PARTIAL_CHECK = """
def reward(answer, workspace):
    return {"full": 1.0, "half": 0.5}.get(answer.strip(), 0.0)
"""


async def test_partial_credit_is_topped_up_and_the_first_attempts_alone_decide_the_reference(
        tmp_path):
    # The first two attempts score 0.5 and 0: they differ, so two more are made, and one of
    # those passes. The reference is shown all the same: none of the first two passed, and
    # a top-up must not take a task's example away.
    (tmp_path / "partial.py").write_text(PARTIAL_CHECK)
    task = {"id": "part", "prompt": "Say full.", "reference": "full",
            "check": {"python": "partial.py"}}
    answers = iter(["half", "none", "full", "none", "full"])
    _, verdicts, _ = await practise(tmp_path, [task], lambda m, k: say(next(answers)), 2, 4)
    attempts = [e for e in verdicts if not e["payload"].get("demonstration")]
    shown = [e for e in verdicts if e["payload"].get("demonstration")]
    assert sorted(e["payload"]["reward"] for e in attempts) == [0.0, 0.0, 0.5, 1.0]
    assert len(shown) == 1 and shown[0]["channel_id"].endswith("-reference")


@pytest.mark.parametrize("mixed", [0, 2, 4])
async def test_mixed_samples_at_most_samples_adds_no_attempt(tmp_path, mixed):
    task = {"id": "mixed", "prompt": "What is 2 plus 3?", "check": {"exact": "5"}}
    answers = iter(["5", "4", "5", "4"])
    answer, verdicts, job = await practise(tmp_path, [task], lambda m, k: say(next(answers)),
                                           4, mixed)
    assert sorted(e["payload"]["reward"] for e in verdicts) == [0.0, 0.0, 1.0, 1.0]
    assert "disagreed" not in answer and job["progress"]["topped_up"] == 0
