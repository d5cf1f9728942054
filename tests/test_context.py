"""The exact context (issue 9, part 3), with a scripted model: each assistant step names
the prompt it was sent (a prefix stored once, then the episode's latest steps), and the
night's rows are those prompts, with only the episode's own messages trained."""

from __future__ import annotations

import json

import pytest

from bot.agent.compaction import SUMMARY_PREFIX
from bot.agent.stray import STRAY_CONTINUE, STRAY_QUESTION
from core.config import NightConfig
from core.storage.store import Store
from tests.scripted import call, say
from tests.test_agent import make_agent
from tests.test_tokens import HF_DIR
from trainer.advantages import episode_row
from trainer.context import prefix_refs, sent_messages, with_context
from trainer.tokens import ACTION, OBSERVATION, render_prompt, render_row


@pytest.fixture
async def store(tmp_path):
    s = await Store.open(tmp_path / "store.db")
    yield s
    await s.close()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(HF_DIR))


def summarising(replies: list):
    """A script that answers the compaction's summary request itself, else replays."""
    def script(messages, kwargs):
        if "Summarise this conversation" in str(messages[-1]["content"]):
            return say("They added numbers before.")
        return replies.pop(0)
    return script


async def _episodes(store):
    return {e.id: e for e in await store.episodes_since(0)}


def _row(episode):
    covered = {s.id: [0.5] for s in episode.steps if s.role == "assistant"}
    row, _ = episode_row(episode, "train", covered, None, set(), NightConfig())
    return row


async def _three_earlier_turns(agent):
    for i in range(3):
        await agent.turn("general", f"earlier question {i}")


async def _compacted_mid_turn(store, tmp_path):
    """The episode of a turn after 3 earlier ones, whose long call overflows the
    context: the history is summarised between its two assistant steps."""
    script = summarising([say(f"answer {i}.") for i in range(3)] + [
        call("add", {"a": 2, "b": 3, "note": "z" * 900}), say("It is 5.")])
    agent, _, _ = make_agent(store, script, tmp_path, keep_recent_messages=2,
                             max_reply_tokens=64, system_prompt="Be brief.")
    agent.config.model.context_tokens = 600
    await _three_earlier_turns(agent)
    result = await agent.turn("general", "add 2 and 3")
    return (await _episodes(store))[result.episode_id]


async def test_a_turn_of_several_steps_stores_one_prefix_with_the_history(store, tmp_path):
    script = [say(f"answer {i}.") for i in range(3)] + [
        call("add", {"a": 2, "b": 3}), call("add", {"a": 5, "b": 1}, "call_2"), say("It is 6.")]
    agent, llm, _ = make_agent(store, script, tmp_path)
    await _three_earlier_turns(agent)
    result = await agent.turn("general", "add 2 and 3, then 1")
    episode = (await _episodes(store))[result.episode_id]
    asked = [s for s in episode.steps if s.role == "assistant"]
    refs = {s.meta["context"]["prefix"] for s in asked}
    assert len(asked) == 3 and len(refs) == 1  # N steps, one prefix
    assert [s.meta["context"]["tail"] for s in asked] == [1, 3, 5]
    count = await store._fetch("SELECT COUNT(*) AS n FROM prompt_prefixes")
    assert count[0]["n"] == 4  # one per turn: each turn's history differs
    prefix = (await store.prompt_prefixes(refs))[refs.pop()]
    assert prefix["tools"] == agent.tools.schemas()
    history = [m["content"] for m in prefix["messages"][1:]]
    assert history == [x for i in range(3) for x in (f"earlier question {i}", f"answer {i}.")]


async def test_every_step_is_rendered_from_exactly_the_messages_it_was_sent(store, tmp_path):
    script = [say(f"answer {i}.") for i in range(3)] + [
        call("add", {"a": 2, "b": 3}), say("It is 5.")]
    agent, llm, _ = make_agent(store, script, tmp_path)
    await _three_earlier_turns(agent)
    await agent.turn("general", "add 2 and 3")
    episodes = await _episodes(store)
    prefixes = await store.prompt_prefixes(prefix_refs(list(episodes.values())))
    sent = iter(llm.calls)
    for episode in episodes.values():
        row = _row(episode)
        (exact,), why = with_context(row, episode, prefixes)
        assert why is None
        for i, step in enumerate(episode.steps):
            if step.role == "assistant":
                messages, kwargs = next(sent)
                assert sent_messages(row, episode, prefixes, i) == messages
                assert (render_prompt(sent_messages(row, episode, prefixes, i), kwargs["tools"])
                        == render_prompt(messages, kwargs["tools"]))
                at = exact["prefix_messages"] + i - 1  # the row: prefix, then the episode
                assert exact["messages"][:at] == messages


async def test_a_compaction_summary_is_in_the_prefix_and_starts_a_second_row(
        store, tmp_path, tokenizer):
    episode = await _compacted_mid_turn(store, tmp_path)
    assert len(await store.events("compaction")) == 1
    prefixes = await store.prompt_prefixes(prefix_refs([episode]))
    first, second = [s.meta["context"] for s in episode.steps if s.role == "assistant"]
    assert first["prefix"] != second["prefix"]
    after = prefixes[second["prefix"]]["messages"]
    assert [m["role"] for m in after] == ["system", "user"]
    assert after[1]["content"] == SUMMARY_PREFIX + "They added numbers before."
    assert second["tail"] == 2  # the call and its result, kept after the summary

    rows, why = with_context(_row(episode), episode, prefixes)
    assert why is None and len(rows) == 2
    texts = []
    for row in rows:
        for seq in render_row(row, tokenizer):  # the context lead: IGNORE (message index -1)
            assert all(m == -1 or m >= row["context"] for m in seq.messages)
            for kind in (ACTION, OBSERVATION):
                texts.append((kind, tokenizer.decode(
                    [t for t, k in zip(seq.ids, seq.kinds) if k == kind])))
    trained = "".join(t for k, t in texts if k == ACTION)
    observed = "".join(t for k, t in texts if k == OBSERVATION)
    assert trained.count("functions.add") == 1 and trained.count("It is 5.") == 1
    assert observed.count("add 2 and 3") == 1 and observed.count("5") == 1
    assert "earlier question" not in observed + trained  # the history is context only


async def test_a_demonstration_is_imitated_in_one_row_of_a_split_episode(store, tmp_path):
    episode = await _compacted_mid_turn(store, tmp_path)
    last = max(i for i, s in enumerate(episode.steps) if s.role == "assistant")
    episode.steps[last].meta = {**episode.steps[last].meta, "demonstration": True}
    prefixes = await store.prompt_prefixes(prefix_refs([episode]))
    rows, why = with_context(_row(episode), episode, prefixes)
    assert why is None and len(rows) == 2
    assert rows[0]["imitate"] == [] and len(rows[1]["imitate"]) == 1
    imitated = rows[1]["messages"][rows[1]["imitate"][0]]
    assert imitated["content"] == episode.steps[last].content


async def test_an_episode_without_a_stored_prompt_trains_on_its_own_messages(
        store, tmp_path, tokenizer):
    agent, _, _ = make_agent(store, [call("add", {"a": 1, "b": 1}), say("2.")], tmp_path)
    result = await agent.turn("general", "1+1?")
    await store._fetch("UPDATE steps SET meta = NULL WHERE role = 'assistant'")  # an old episode
    episode = (await _episodes(store))[result.episode_id]
    row = _row(episode)
    rows, why = with_context(row, episode, {})
    assert why == "no-prefix" and rows == [row]
    kinds = [k for seq in render_row(row, tokenizer) for k in seq.kinds]
    assert ACTION in kinds and OBSERVATION in kinds


async def test_forgetting_an_earlier_episode_deletes_the_prefixes_carrying_its_text(
        store, tmp_path):
    agent, _, _ = make_agent(store, [say("a."), say("b."), say("c.")], tmp_path)
    forgotten = await agent.turn("general", "my secret plan")
    await agent.turn("general", "next")
    fresh = await agent.turn("other", "elsewhere")
    await store.forget_episode(forgotten.episode_id)
    episodes = await _episodes(store)
    prefixes = await store.prompt_prefixes(prefix_refs(list(episodes.values())))
    assert "secret plan" not in json.dumps(prefixes)
    later = episodes[forgotten.episode_id + 1]
    assert with_context(_row(later), later, prefixes)[1] == "prefix-missing"
    assert with_context(_row(episodes[fresh.episode_id]), episodes[fresh.episode_id],
                        prefixes)[1] is None  # a prefix without its text stays


async def test_a_prefix_holding_a_secret_falls_back(store, tmp_path):
    agent, _, _ = make_agent(store, [say("ok."), say("done.")], tmp_path)
    await agent.turn("general", "token sk-abc")
    second = await agent.turn("general", "go on")
    episode = (await _episodes(store))[second.episode_id]
    prefixes = await store.prompt_prefixes(prefix_refs([episode]))
    rows, why = with_context(_row(episode), episode, prefixes, lambda text: "sk-abc" in text)
    assert why == "prefix-secret" and len(rows) == 1


async def test_harness_text_is_neither_action_nor_observation_with_the_prefix(
        store, tmp_path, tokenizer):
    script = [say("answer 0."), call("add", {"a": 10 ** 250, "b": 0}), say("I'll add them now:"),
              say('{"answer": "no"}'), call("add", {"a": 1, "b": 2}, "call_2"), say("Done: 3.")]
    agent, _, _ = make_agent(store, script, tmp_path, tool_output_chars=200)
    await agent.turn("general", "earlier question")
    result = await agent.turn("general", "add")
    episode = (await _episodes(store))[result.episode_id]
    prefixes = await store.prompt_prefixes(prefix_refs([episode]))
    (row,), why = with_context(_row(episode), episode, prefixes)
    assert why is None and row["prefix_messages"] == 3  # system, earlier question, answer
    marked = {}
    for seq in render_row(row, tokenizer):
        for k, m in zip(seq.kinds, seq.messages):
            marked.setdefault(m, set()).add(k)
    probes = [i for i, m in enumerate(row["messages"])
              if m["content"] in (STRAY_QUESTION, STRAY_CONTINUE, '{"answer": "no"}')]
    assert len(probes) == 3 and all(i not in marked for i in probes)  # IGNORE: index -1
    observed = "".join(tokenizer.decode([t for t, k in zip(seq.ids, seq.kinds) if k == OBSERVATION])
                       for seq in render_row(row, tokenizer))
    assert any("characters cut" in m["content"] for m in row["messages"] if m["role"] == "tool")
    assert "1000" in observed and "characters cut" not in observed
    assert not any(m < row["prefix_messages"] for m in marked if m != -1)


async def test_the_night_writes_rows_with_the_exact_prompt(store, tmp_path, tokenizer):
    """run_part1 (judge served by a scripted server): the dataset's rows carry the prefix,
    and the night counts how many episodes were rendered exactly."""
    from tests.test_night_judge import config_for, report, run, serve
    from core.storage.embedder import MiniLMEmbedder

    agent, _, _ = make_agent(store, [say("hi."), call("add", {"a": 2, "b": 3}), say("5.")],
                             tmp_path)
    await agent.turn("general", "hello")
    await agent.turn("general", "what is 2+3?")
    server = await serve(lambda kind, body: report(
        [{"start": 0, "end": 5, "description": "answer", "score": 2}])
        if kind == "judge_report" else {"score": 1, "length": 1})
    try:
        result, _ = await run(config_for(tmp_path), store, server, MiniLMEmbedder())
    finally:
        await server.stop()
    rows = [json.loads(line) for line in result.dataset.read_text().splitlines()]
    episode_rows = [r for r in rows if r["kind"] == "episode"]
    assert result.counts["context:exact"] == 2 and len(episode_rows) == 2
    second = episode_rows[-1]
    assert [m["content"] for m in second["messages"][1:3]] == ["hello", "hi."]
    assert second["prefix_messages"] == 3 == second["context"]
    from trainer import train as T

    # The trainer's examples: each episode's judged answers and call, nothing of the history.
    examples = T.build_examples(episode_rows, tokenizer, T.Settings(max_tokens=8192))
    assert sum(e.terms for e in examples) == 3  # "hi.", the add call, "5."
    from trainer.gate_items import eval_items

    for row in episode_rows:
        row["split"] = "eval"
    assert [i.request for i in eval_items(episode_rows, 10)] == ["hello", "what is 2+3?"]


async def test_a_prefix_is_stored_once_and_only_with_a_committed_step(store, tmp_path):
    from core.storage.store import Prefix, Step

    prefix = Prefix([{"role": "system", "content": "s"}], None, (1,))
    ep = await store.start_episode("c")
    await store.add_step(ep, Step(role="user", content="hi"))
    meta = {"context": {"prefix": prefix.ref, "tail": 1}}
    await store.add_step(ep, Step(role="assistant", content="a", meta=meta), prefix=prefix)
    await store.add_step(ep, Step(role="assistant", content="b", meta=meta), prefix=prefix)
    await store.end_episode(ep, "complete")
    other = Prefix([{"role": "system", "content": "other"}])
    with pytest.raises(ValueError, match="already complete"):
        await store.add_step(ep, Step(role="assistant", content="c"), prefix=other)
    rows = await store._fetch("SELECT ref FROM prompt_prefixes")
    assert [r["ref"] for r in rows] == [prefix.ref]  # once; the refused step left nothing
    assert (await store.prompt_prefixes([prefix.ref, other.ref])) == {
        prefix.ref: {"messages": prefix.messages, "tools": [], "sources": [1]}}


async def test_the_answer_asked_in_words_after_a_repeat_is_trained_on_what_was_sent(
        store, tmp_path, tokenizer):
    script = [say(f"answer {i}.") for i in range(3)] + [
        call("add", {"a": 2, "b": 3}, f"c{i}") for i in range(3)] + [say("It is 5.")]
    agent, llm, _ = make_agent(store, script, tmp_path, repeat_limit=3)
    await _three_earlier_turns(agent)
    result = await agent.turn("general", "add 2 and 3")
    assert result.reply == "It is 5." and llm.calls[-1][1].get("tools") is None
    episode = (await _episodes(store))[result.episode_id]
    prefixes = await store.prompt_prefixes(prefix_refs([episode]))
    answer = episode.steps[-1]
    plain = prefixes[answer.meta["context"]["prefix"]]
    assert answer.meta["context"]["tail"] == 0 and not plain["tools"]
    assert plain["messages"] == llm.calls[-1][0]  # the words-only prompt, stored as sent
    rows, why = with_context(_row(episode), episode, prefixes)
    assert why is None and len(rows) == 2 and not rows[1]["tools"]
    trained = "".join(tokenizer.decode([t for t, k in zip(seq.ids, seq.kinds) if k == ACTION])
                      for row in rows for seq in render_row(row, tokenizer))
    assert trained.count("It is 5.") == 1 and trained.count("functions.add") == 3
