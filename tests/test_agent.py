"""The agent's linear loop, with a scripted model and a small real tool set."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from bot.agent.compaction import SUMMARY_PREFIX
from bot.agent.loop import Agent
from bot.agent.messages import history_messages
from bot.agent.stray import STRAY_QUESTION
from bot.channels import RuleStrayDetector
from core.config import Config
from core.storage.store import Store
from tests.scripted import ScriptedLLM, call, say


@dataclass
class Result:
    ok: bool
    output: str
    meta: dict = field(default_factory=dict)


class AddTools:
    """One real tool, ``add(a, b)``, with the registry's error kinds."""

    def __init__(self) -> None:
        self.calls = []

    def schemas(self):
        return [{"type": "function", "function": {"name": "add", "description": "a+b",
                 "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                "b": {"type": "integer"}}, "required": ["a", "b"]}}}]

    async def call(self, name, arguments, ctx):
        self.calls.append((name, arguments, ctx))
        if name != "add":
            return Result(False, f"there is no tool {name!r}; the tools are: add.",
                          {"error": "unknown_tool"})
        try:
            args = json.loads(arguments)
            return Result(True, str(int(args["a"]) + int(args["b"])))
        except (ValueError, KeyError, TypeError) as exc:
            return Result(False, f"bad arguments ({exc}); add takes a and b, integers.",
                          {"error": "arguments"})


@pytest.fixture
async def store(tmp_path):
    s = await Store.open(tmp_path / "store.db")
    yield s
    await s.close()


def make_agent(store, script, tmp_path, **agent_settings):
    config = Config()
    config.paths.data_dir = tmp_path
    for key, value in agent_settings.items():
        setattr(config.agent, key, value)
    llm = ScriptedLLM(script)
    tools = AddTools()
    agent = Agent(config, llm, store, tools, context_for=lambda channel: f"ctx:{channel}",
                  sys_section=lambda channel: "Prefer short answers.",
                  stray=RuleStrayDetector())
    return agent, llm, tools


async def roles(store, episode):
    eps = await store.episodes_since(0)
    ep = next(e for e in eps if e.id == episode)
    return [s.role for s in ep.steps], ep


async def test_tool_call_then_observation_then_answer_is_stored_step_by_step(store, tmp_path):
    agent, llm, tools = make_agent(store, [call("add", {"a": 2, "b": 3}), say("It is 5.")],
                                   tmp_path)
    result = await agent.turn("general", "what is 2+3?")
    assert result.ok and result.reply == "It is 5." and result.steps == 2
    assert result.tool_rounds == 1
    got, ep = await roles(store, result.episode_id)
    assert got == ["system", "user", "assistant", "tool", "assistant"]
    assert ep.status == "complete"
    assert ep.steps[3].content == "5" and ep.steps[2].tool_calls[0]["function"]["name"] == "add"
    # The second model call saw the observation; the system prompt has the channel's section.
    second = llm.calls[1][0]
    assert second[-1] == {"role": "tool", "tool_call_id": "call_1", "name": "add", "content": "5"}
    assert "Prefer short answers." in second[0]["content"]
    assert tools.calls[0][2] == "ctx:general"


async def test_malformed_call_becomes_an_observation_and_the_model_recovers(store, tmp_path):
    agent, llm, _ = make_agent(store, [call("add", "{not json"), call("sum", {"a": 1}),
                                       call("add", {"a": 1, "b": 1}), say("2")], tmp_path)
    result = await agent.turn("general", "1+1?")
    assert result.ok and result.reply == "2"
    _, ep = await roles(store, result.episode_id)
    observations = [s.content for s in ep.steps if s.role == "tool"]
    assert observations[0].startswith("ERROR: bad arguments")
    assert "the tools are: add" in observations[1]
    assert observations[2] == "2"


async def test_consecutive_format_errors_end_the_turn_with_a_clear_message(store, tmp_path):
    agent, _, _ = make_agent(store, [call("nope", "{}")] * 3, tmp_path, max_format_errors=3)
    result = await agent.turn("general", "do it")
    assert not result.ok and "could not form a valid tool call 3 times" in result.reply
    _, ep = await roles(store, result.episode_id)
    assert ep.status == "aborted"


async def test_step_limit_stops_a_looping_model(store, tmp_path):
    agent, llm, _ = make_agent(store, lambda m, kw: call("add", {"a": 1, "b": 1}), tmp_path,
                               max_steps=4)
    result = await agent.turn("general", "loop")
    assert not result.ok and "stopped after 4 steps" in result.reply
    assert len(llm.calls) == 4


async def test_long_tool_output_is_truncated_with_a_note(store, tmp_path):
    agent, llm, tools = make_agent(store, [call("add", {"a": 10**300, "b": 0}), say("ok")],
                                   tmp_path, tool_output_chars=200)
    result = await agent.turn("general", "big")
    _, ep = await roles(store, result.episode_id)
    observation = ep.steps[3].content
    assert observation.startswith("1" + "0" * 199) and "more characters cut" in observation


async def test_reasoning_from_earlier_turns_is_stripped_from_the_context(store, tmp_path):
    agent, llm, _ = make_agent(store, [say("<think>secret plan</think>Hello!"), say("Fine.")],
                               tmp_path)
    first = await agent.turn("general", "hi")
    assert first.reply == "Hello!"
    await agent.turn("general", "how are you?")
    context = json.dumps(llm.calls[1][0])
    assert "secret plan" not in context and "Hello!" in context


async def test_compaction_summarises_older_messages_and_keeps_recent_ones(store, tmp_path):
    def script(messages, kwargs):
        if "Summarise this conversation" in messages[-1]["content"]:
            return say("They talked about apples.")
        return say("x" * 400)

    agent, llm, _ = make_agent(store, script, tmp_path, keep_recent_messages=2,
                               max_reply_tokens=64, history_steps=100)
    agent.config.model.context_tokens = 512
    for i in range(6):
        await agent.turn("general", f"message {i} " + "y" * 300)
    last = llm.calls[-1][0]
    assert last[0]["role"] == "system"
    assert last[1]["content"] == SUMMARY_PREFIX + "They talked about apples."
    assert "message 5" in last[-1]["content"]
    assert len(last) == 4  # system, summary, 2 recent
    events = await store.events("compaction")
    assert events and events[-1]["payload"]["summary"] == "They talked about apples."


async def test_stray_end_of_turn_is_questioned_and_the_agent_continues(store, tmp_path):
    script = [say("I'll add the numbers now:"), say('{"answer": "no"}'),
              call("add", {"a": 2, "b": 2}), say("The sum is 4.")]
    agent, llm, _ = make_agent(store, script, tmp_path)
    result = await agent.turn("general", "add 2 and 2")
    assert result.ok and result.reply == "The sum is 4."
    assert llm.calls[1][0][-1]["content"] == STRAY_QUESTION
    assert llm.calls[1][1]["response_format"]["type"] == "json_object"
    events = await store.events("stray_end_of_turn")
    assert len(events) == 1 and events[0]["payload"]["answer"] == "no"
    _, ep = await roles(store, result.episode_id)
    flagged = next(s for s in ep.steps if s.id == events[0]["payload"]["step_id"])
    assert flagged.content == "I'll add the numbers now:"


async def test_a_yes_to_the_stray_question_keeps_the_answer(store, tmp_path):
    agent, llm, _ = make_agent(store, [say("Here is the list:"), say('{"answer": "yes"}')],
                               tmp_path)
    result = await agent.turn("general", "list")
    assert result.reply == "Here is the list:" and len(llm.calls) == 2


async def test_the_probes_json_written_again_after_the_go_ahead_is_never_the_reply(store, tmp_path):
    """Told to continue, the embedded model wrote ``{ "answer" : "yes"}`` as its reply
    (bench/learning.py's practice): the answer it was asked about is delivered instead."""
    script = [say("Here is the list:"), say('{"answer": "no"}'), say('{ "answer" : "yes"}')]
    agent, llm, _ = make_agent(store, script, tmp_path)
    result = await agent.turn("general", "list")
    assert result.ok and result.reply == "Here is the list:" and len(llm.calls) == 3
    _, ep = await roles(store, result.episode_id)
    assert ep.status == "complete"


@pytest.mark.parametrize("reply,flagged", [
    ("Sure, here are the steps:", True),
    ("I'll write the file next.", True),
    ("I have created the file notes.txt.", True),
    ("The capital of France is Paris.", False),
    ("Shall I write it for you? I'll wait for your answer?", False),
    ("", False),
])
def test_rule_stray_detector(reply, flagged):
    assert bool(RuleStrayDetector().flag(reply, tool_steps=0)) is flagged


def test_history_drops_an_orphan_tool_observation():
    from core.storage.store import StoredStep

    def step(role, content):
        return StoredStep(role=role, content=content, id=1, episode_id=1, channel_id="c",
                          seq=0, created_at=0.0)

    messages = history_messages([step("tool", "5"), step("user", "hi"), step("system", "s")])
    assert messages == [{"role": "user", "content": "hi"}]


def test_reasoning_is_stripped_as_the_regex_did_in_one_pass():
    """Equal to ``<think>.*?</think>\\s*`` removed, on random texts; linear on a tool output
    that repeats the opening tag (the regex rescanned the rest from each one)."""
    import random
    import re

    from bot.agent.messages import strip_reasoning

    regex = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
    rng = random.Random(3)
    bits = ["<think>", "</think>", "a", " ", "\n", "b c", "<think", "think>"]
    for _ in range(3000):
        text = "".join(rng.choice(bits) for _ in range(rng.randint(0, 12)))
        assert strip_reasoning(text) == regex.sub("", text), text
    many = "<think>x " * 200_000  # 1.6 MB, never closed: kept whole
    assert strip_reasoning(many) == many
