"""The agent's guards, with a scripted model that behaves as issue 12's table did:
it writes the template's call syntax as its reply, and it loops read_file/list_dir
on one unchanged file until the step limit. The tools are the real registry's."""

from __future__ import annotations

import pytest

from bot.agent.guards import looks_like_template_call, template_call
from bot.agent.loop import Agent
from core.config import Config
from core.storage.store import Store
from sandbox.paths import workspace_for
from tests.scripted import ScriptedLLM, call, say
from tools import Registry, ToolContext, default_registry


@pytest.fixture
async def store(tmp_path):
    s = await Store.open(tmp_path / "store.db")
    yield s
    await s.close()


def make_agent(store, script, tmp_path, names=("read_file", "list_dir", "write_file"),
               **settings):
    config = Config()
    config.paths.data_dir = tmp_path
    for key, value in settings.items():
        setattr(config.agent, key, value)
    full, registry = default_registry(), Registry()
    for name in names:
        registry.register(full.get(name))
    workspace = workspace_for(tmp_path / "workspaces", "general")
    ctx = ToolContext.open("general", workspace, tmp_path / "state")
    (workspace.root / "a.txt").write_text("alpha\n")
    llm = ScriptedLLM(script)
    return Agent(config, llm, store, registry, context_for=lambda channel: ctx), llm


async def episode(store, episode_id):
    return next(e for e in await store.episodes_since(0) if e.id == episode_id)


def test_template_syntax_is_recognised_and_parsed_only_when_valid():
    names = {"read_file"}
    assert looks_like_template_call("functions.redo:")
    assert looks_like_template_call('  functions.read_file: {"path": "a"}\n')
    assert not looks_like_template_call("The functions.py file is empty.")
    parsed = template_call(say('functions.read_file: {"path": "a"}'), names)
    assert parsed.content == "" and parsed.tool_calls[0]["function"] == {
        "name": "read_file", "arguments": '{"path": "a"}'}
    assert template_call(say("functions.read_file:"), names).tool_calls[0]["function"][
        "arguments"] == "{}"
    for text in ("functions.redo:", 'functions.read_file: {"path": ', "functions.read_file: [1]"):
        assert template_call(say(text), names).tool_calls == []  # a format error, not a call


async def test_unknown_call_syntax_is_never_delivered_but_re_asked(store, tmp_path):
    agent, llm = make_agent(store, [say("functions.redo:"), say("Blue.")], tmp_path)
    result = await agent.turn("general", "Thanks. Name one colour.")
    assert result.ok and result.reply == "Blue."
    asked_again = llm.calls[1][0][-1]
    assert asked_again["role"] == "user" and "functions.redo:" in asked_again["content"]
    assert "read_file" in asked_again["content"]  # it says what is valid
    events = await store.events("template_syntax")
    assert [e["episode_id"] for e in events] == [result.episode_id]
    ep = await episode(store, result.episode_id)
    assert [s.role for s in ep.steps] == ["system", "user", "assistant", "user", "assistant"]
    assert ep.steps[3].meta == {"probe": "format"}


async def test_call_syntax_every_time_ends_the_turn_with_a_clear_message(store, tmp_path):
    agent, llm = make_agent(store, lambda messages, kw: say("functions.redo:"), tmp_path,
                            max_format_errors=3)
    result = await agent.turn("general", "Say goodbye in one short sentence.")
    assert not result.ok and not looks_like_template_call(result.reply)
    assert "valid tool call 3 times" in result.reply and len(llm.calls) == 3
    assert (await episode(store, result.episode_id)).status == "aborted"


async def test_call_syntax_naming_a_tool_runs_as_that_call(store, tmp_path):
    agent, llm = make_agent(store, [say('functions.read_file: {"path": "a.txt"}'),
                                    say("The file says alpha.")], tmp_path)
    result = await agent.turn("general", "What is in a.txt?")
    assert result.ok and result.reply == "The file says alpha."
    ep = await episode(store, result.episode_id)
    assistant, observation = ep.steps[2], ep.steps[3]
    assert assistant.tool_calls[0]["function"]["name"] == "read_file"
    assert observation.role == "tool" and "alpha" in observation.content
    assert observation.tool_call_id == assistant.tool_calls[0]["id"]


def looping(messages, kwargs):
    """read_file and list_dir on the same file, in turn, for as long as tools are offered;
    asked without tools, it answers."""
    if not kwargs.get("tools"):
        return say("a.txt contains alpha.")
    tool_steps = sum(1 for m in messages if m["role"] == "tool")
    if tool_steps % 2 == 0:
        return call("read_file", {"path": "a.txt"}, f"c{tool_steps}")
    return call("list_dir", '{"path":  "a.txt"}', f"c{tool_steps}")


async def test_a_call_repeated_with_the_same_result_is_stopped_and_answered(store, tmp_path):
    agent, llm = make_agent(store, looping, tmp_path, max_steps=8, repeat_limit=3)
    result = await agent.turn("general", "Hello from another channel.")
    assert result.ok and result.reply == "a.txt contains alpha."
    # read, list, read, list, read (3rd identical read) -> the answer without tools
    assert len(llm.calls) == 6 and result.steps == 6
    assert all(kw.get("tools") for _, kw in llm.calls[:5])
    assert "tools" not in llm.calls[5][1] or llm.calls[5][1]["tools"] is None
    # The answer is asked from the conversation in words: under a function-calling
    # template the calls would be rendered in the call syntax the model then writes back.
    sent = llm.calls[5][0]
    assert [m["role"] for m in sent] == ["system", "user"] and not any(
        m.get("tool_calls") for m in sent)
    assert sent[1]["content"] == "Hello from another channel."
    results = sent[0]["content"].split("What your tools returned this turn", 1)[1]
    assert "- read_file: a.txt: lines 1-1 of 1" in results and "- list_dir: " in results
    assert results.count("- read_file:") == 1  # the same result once
    events = await store.events("repeated_call")
    assert len(events) == 1 and events[0]["episode_id"] == result.episode_id
    assert events[0]["payload"]["tool"] == "read_file"
    assert events[0]["payload"]["lesson"] == "repeated polling"
    ep = await episode(store, result.episode_id)
    assert ep.status == "complete"
    assert "3rd time" in [s for s in ep.steps if s.role == "tool"][-1].content
    # the event names the assistant message that made the repeated call, for the night
    caller = next(s for s in ep.steps if s.id == events[0]["payload"]["step_id"])
    assert caller.role == "assistant" and caller.tool_calls[0]["function"]["name"] == "read_file"
    assert caller.seq == ep.steps[-3].seq  # ..., the 3rd read, its observation, the answer


async def test_a_repeat_whose_result_changes_is_not_a_loop(store, tmp_path):
    agent, llm = make_agent(store, [], tmp_path, repeat_limit=3)
    root = agent.context_for("general").workspace.root
    replies = iter([call("read_file", {"path": "a.txt"}, f"c{i}") for i in range(3)]
                   + [say("done")])

    def script(messages, kwargs):
        root.joinpath("a.txt").write_text(f"version {len(messages)}\n")  # it changes each time
        return next(replies)

    agent.llm = llm = ScriptedLLM(script)
    result = await agent.turn("general", "Watch a.txt.")
    assert result.reply == "done" and all(kw.get("tools") for _, kw in llm.calls)
    assert await store.events("repeated_call") == []


async def test_call_syntax_after_tools_were_withdrawn_is_not_run(store, tmp_path):
    def script(messages, kwargs):
        if kwargs.get("tools"):
            return call("read_file", {"path": "a.txt"}, f"c{len(messages)}")
        if not messages[-1]["content"].startswith("Your last message was tool-call syntax"):
            return say('functions.read_file: {"path": "a.txt"}')
        return say("It says alpha.")

    agent, llm = make_agent(store, script, tmp_path, repeat_limit=2)
    result = await agent.turn("general", "Read a.txt.")
    assert result.ok and result.reply == "It says alpha."
    assert "no tools are offered" in llm.calls[-1][0][-1]["content"]
    ep = await episode(store, result.episode_id)
    assert sum(1 for s in ep.steps if s.role == "tool") == 2  # the text call was not run


async def test_the_tool_list_is_stored_once_per_tool_set_and_read_back_with_the_episode(
        store, tmp_path):
    agent, llm = make_agent(store, lambda messages, kw: say("ok"), tmp_path)
    first = await agent.turn("general", "one")
    second = await agent.turn("general", "two")
    episodes = {e.id: e for e in await store.episodes_since(0)}
    for result in (first, second):
        system = episodes[result.episode_id].steps[0]
        assert system.role == "system"
        assert system.meta["tools"] == agent.tools.schemas()  # what the model was offered
    refs = {episodes[r.episode_id].steps[0].meta["tools_ref"] for r in (first, second)}
    assert len(refs) == 1
    rows = await store._fetch("SELECT ref FROM tool_sets")
    assert [r["ref"] for r in rows] == list(refs)  # stored once for both turns


async def test_the_last_step_is_asked_for_words_so_a_wandering_turn_still_answers(
        store, tmp_path):
    """Calls that differ each time (no repeat) until the step limit, as "Hello" did: the
    last step offers no tools, in words, and its answer is the turn's."""
    def wandering(messages, kwargs):
        if not kwargs.get("tools"):
            return say("Hello! How can I help?")
        return call("read_file", {"path": f"f{len(messages)}.txt"}, f"c{len(messages)}")

    agent, llm = make_agent(store, wandering, tmp_path, max_steps=4)
    result = await agent.turn("general", "Hello from another channel.")
    assert result.ok and result.reply == "Hello! How can I help?" and result.steps == 4
    assert result.tool_rounds == 3
    assert [bool(kw.get("tools")) for _, kw in llm.calls] == [True, True, True, False]
    assert llm.calls[-1][0][-1] == {"role": "user", "content": "Hello from another channel."}
    assert (await episode(store, result.episode_id)).status == "complete"
