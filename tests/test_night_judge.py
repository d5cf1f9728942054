"""The night, part 1, against a deterministic scripted judge server."""

from __future__ import annotations

import json

import pytest

from core.config import Config
from core.storage.embedder import MiniLMEmbedder
from core.storage.events import Event
from core.storage.store import Step, Store
from tests.judge_server import JudgeServer
from trainer.client import JsonClient, ModelUnavailable
from trainer.collect import split_of
from trainer.night import remember, run_part1
from trainer.value import ValueMemory, predict

REPORT = "judge_report"


@pytest.fixture(scope="module")
def embedder():
    return MiniLMEmbedder()


@pytest.fixture
async def store(tmp_path):
    s = await Store.open(tmp_path / "store.db")
    yield s
    await s.close()


def config_for(tmp_path, **night) -> Config:
    config = Config()
    config.paths.data_dir = tmp_path
    config.night.understanding_fraction = 0.0
    config.night.eval_percent = 0
    for key, value in night.items():
        setattr(config.night, key, value)
    return config


async def tool_episode(store, channel="general", ask="what is 2+3?", answer="It is 5.",
                       status="complete", meta=None):
    """user, assistant (tool call), tool, assistant: four messages after the system prompt."""
    ep = await store.start_episode(channel)
    await store.add_step(ep, Step(role="system", content="sys", meta={"tools": []}))
    user = await store.add_step(ep, Step(role="user", content=ask, meta=meta))
    calls = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]
    await store.add_step(ep, Step(role="assistant", content="", tool_calls=calls))
    await store.add_step(ep, Step(role="tool", content="5", name="add", tool_call_id="c1"))
    final = await store.add_step(ep, Step(role="assistant", content=answer))
    await store.end_episode(ep, status)
    return ep, user, final


def report(subtasks, action="report", before=0, after=0):
    return {"action": action, "before": before, "after": after, "subtasks": subtasks}


async def run(config, store, server, embedder, night_id=1):
    client = JsonClient(server.url, "judge", 10)
    memory = ValueMemory(config.data_dir / "value", embedder)
    try:
        return await run_part1(config, store, night_id, client, memory, since=0.0,
                               until=1e12), memory
    finally:
        await client.close()


async def serve(answer):
    return await JudgeServer(answer).start()


async def test_advantage_arithmetic_matches_a_hand_computation(store, tmp_path, embedder):
    await tool_episode(store, "a", ask="what is 2+3?")
    await tool_episode(store, "b", ask="what is 4+4?")

    def answer(kind, body):
        if kind == REPORT:
            score = 2 if "2+3" in body["messages"][1]["content"] else 0
            return report([{"start": 0, "end": 3, "description": "add numbers", "score": score}])
        return {"score": 0, "length": 1}

    server = await serve(answer)
    try:
        result, memory = await run(config_for(tmp_path), store, server, embedder)
    finally:
        await server.stop()
    # a: r = 2/2 = 1, r_hat = 0; length = 2 assistant turns, len_hat = 1:
    #    A_task = (1 - 0) + 0.5 * (-(2 - 1) / 10) = 0.95; turn penalty 0.02 * (2 - 1) = 0.02 -> 0.93
    # b: r = 0: A_task = -0.05, minus 0.02 -> -0.07
    # centred over the night's four judged messages: mean (2 * 0.93 - 2 * 0.07) / 4 = 0.43
    table = await store.advantages(1)
    assert [round(r["advantage"], 6) for r in table] == [0.5, 0.5, -0.5, -0.5]
    assert table[0]["parts"] == {"task": pytest.approx(0.95), "turn_penalty": pytest.approx(-0.02),
                                 "centre": pytest.approx(-0.43)}
    assert result.counts["advantage_mean_before_centring"] == pytest.approx(0.43)
    rows = [json.loads(line) for line in result.dataset.read_text().splitlines()]
    episode_rows = [r for r in rows if r["kind"] == "episode"]
    assert episode_rows[0]["advantages"] == [None, None, pytest.approx(0.5), None,
                                             pytest.approx(0.5)]
    value_rows = [r for r in rows if r["kind"] == "value_prediction"]
    # prediction errors: a: (|1 - 0| / 2 + |2 - 1| / 2) / 2 = 0.5; b: (0 + 0.5) / 2 = 0.25;
    # rewards -0.5 and -0.25 around their mean -0.375
    assert sorted(r["advantages"][-1] for r in value_rows) == [pytest.approx(-0.125),
                                                               pytest.approx(0.125)]
    assert result.manifest["counts"]["rows"] == 4 and len(result.manifest["rows"]) == 4
    assert result.manifest["reward_sources"] == {"judge": 2}
    assert memory.count() == 0  # the memory waits for the night's training (remember)


async def test_the_judge_may_extend_the_window_before_reporting(store, tmp_path, embedder):
    for _ in range(3):
        await tool_episode(store)  # 12 messages: windows 0..9 and 10..11

    def answer(kind, body):
        if kind != REPORT:
            return {"score": 0, "length": 1}
        text = body["messages"][1]["content"]
        if "Window to judge (messages 0 to 9)" in text and "Later context" not in text:
            return report([], action="extend", after=2)
        return report([{"start": 8, "end": 11, "description": "third sum", "score": 1}]
                      if "messages 0 to 9" in text else [])

    server = await serve(answer)
    try:
        result, _ = await run(config_for(tmp_path), store, server, embedder)
    finally:
        await server.stop()
    first_window = [b for b in server.of(REPORT) if "messages 0 to 9" in b["messages"][1]["content"]]
    assert len(first_window) == 2
    assert "Later context" in first_window[1]["messages"][1]["content"]
    end_enum = first_window[1]["response_format"]["schema"]["properties"][
        "subtasks"]["items"]["properties"]["end"]["enum"]
    assert max(end_enum) == 11  # the sub-task may end inside the extended view
    assert result.counts["windows_judged"] == 2 and result.counts["subtasks"] == 1


async def test_an_unparseable_window_is_skipped_and_counted_never_invented(store, tmp_path, embedder):
    await tool_episode(store)
    server = await serve(lambda kind, body: "not json at all" if kind == REPORT
                         else {"score": 0, "length": 1})
    try:
        result, memory = await run(config_for(tmp_path, judge_attempts=3), store, server, embedder)
    finally:
        await server.stop()
    assert len(server.of(REPORT)) == 3
    assert result.counts["windows_skipped"] == 1 and result.counts["subtasks"] == 0
    assert await store.advantages(1) == []
    record = (await store.records(1, "judgment"))["general:0"]
    assert record["status"] == "skipped" and "not json" in record["reason"]
    assert memory.count() == 0


async def test_out_of_range_subtasks_are_rejected_then_retried(store, tmp_path, embedder):
    await tool_episode(store)
    replies = [report([{"start": 0, "end": 99, "description": "x", "score": 2}]),
               report([{"start": 1, "end": 3, "description": "sum", "score": -2}])]
    server = await serve(lambda kind, body: replies.pop(0) if kind == REPORT
                         else {"score": 0, "length": 2})
    try:
        result, _ = await run(config_for(tmp_path), store, server, embedder)
    finally:
        await server.stop()
    assert result.counts["windows_judged"] == 1
    table = await store.advantages(1)
    # r = -1, r_hat = 0, length 2 = len_hat: A = -1, minus the turn penalty 0.02 (then centred)
    assert [r["parts"]["task"] for r in table] == [-1.0, -1.0]
    assert [round(r["advantage"] - r["parts"]["centre"], 6) for r in table] == [-1.02, -1.02]


async def test_memory_is_updated_only_by_remember_so_no_prediction_sees_this_night(
        store, tmp_path, embedder):
    await tool_episode(store, "a", "add two and three")
    await tool_episode(store, "b", "add two and three please")

    def answer(kind, body):
        if kind == REPORT:
            return report([{"start": 0, "end": 3, "description": "add two and three", "score": 2}])
        return {"score": 1, "length": 2}

    server = await serve(answer)
    try:
        result, memory = await run(config_for(tmp_path), store, server, embedder)
        prompts = [b["messages"][1]["content"] for b in server.of("value_prediction")]
        assert len(prompts) == 2 and all("no similar past tasks" in p for p in prompts)
        assert memory.count() == 0  # training has not succeeded yet
        remember(memory, result, now=1e9)  # the night calls this after training
        assert memory.count() == 2
        # A prediction for night 1 (a re-run) never retrieves night 1's own sub-tasks.
        own = await predict(JsonClient(server.url, "judge", 10), memory, result.subtasks[0], 8,
                            14.0, now=1e9, exclude_night=1)
        assert own is not None and own.neighbours == 0
        await tool_episode(store, "a", "add two and three again")
        server.requests.clear()
        await run(config_for(tmp_path), store, server, embedder, night_id=2)
        later = [b["messages"][1]["content"] for b in server.of("value_prediction")]
        assert later and all("Similar past tasks" in p for p in later)
    finally:
        await server.stop()


async def test_a_crashed_night_resumes_without_rejudging_finished_windows(store, tmp_path, embedder):
    for channel in ("a", "b", "c"):
        await tool_episode(store, channel)
    state = {"fail": True}

    def answer(kind, body):
        if kind == REPORT:
            if state["fail"] and len(server.of(REPORT)) > 2:
                return 500
            return report([{"start": 0, "end": 3, "description": "sum", "score": 1}])
        return {"score": 0, "length": 2}

    server = await serve(answer)
    try:
        with pytest.raises(ModelUnavailable):
            await run(config_for(tmp_path), store, server, embedder)
        judged_before = set((await store.records(1, "judgment")).keys())
        assert judged_before == {"a:0", "b:0"}
        state["fail"] = False
        server.requests.clear()
        result, _ = await run(config_for(tmp_path), store, server, embedder)
    finally:
        await server.stop()
    rejudged = [b["messages"][1]["content"] for b in server.of(REPORT)]
    assert len(rejudged) == 1
    assert result.counts["windows_resumed"] == 2 and result.counts["windows_judged"] == 3


async def test_only_harness_errors_incomplete_turns_failed_checks_and_secrets_are_excluded(
        store, tmp_path, embedder):
    await tool_episode(store, status="complete")
    await tool_episode(store, status="aborted")  # the step limit: a failure to learn from
    await tool_episode(store, status="errored")
    rejected, _, _ = await tool_episode(store)  # a negative example
    await store.add_label(rejected, "rejected", "reaction")
    await tool_episode(store, answer="my key is AKIAIOSFODNN7EXAMPLE")
    crashed, _, _ = await tool_episode(store)
    await store.add_event("general", crashed, Event.VERIFIER_REWARD,
                          {"reward": None, "check": "python:check.py", "error": "timed out"})
    open_ep = await store.start_episode("general")
    await store.add_step(open_ep, Step(role="user", content="hi"))
    server = await serve(lambda kind, body: report([]) if kind == REPORT else {"score": 0, "length": 1})
    try:
        result, _ = await run(config_for(tmp_path), store, server, embedder)
    finally:
        await server.stop()
    excluded = result.manifest["counts"]["excluded"]
    assert excluded == {"errored": 1, "secret": 1, "incomplete": 1, "check-failed": 1}
    assert result.manifest["counts"]["eligible"] == 3


def test_the_split_is_a_deterministic_hash_of_the_episode_id():
    first = [split_of(i, 10) for i in range(2000)]
    assert first == [split_of(i, 10) for i in range(2000)]
    assert 150 < first.count("eval") < 250
    assert all(split_of(i, 0) == "train" for i in range(100))
