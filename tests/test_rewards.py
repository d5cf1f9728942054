"""Reward sources by precedence (verifier > person > judge), through the night's part 1
against a scripted judge server; the verifier event contract; harness steps in rows."""

from __future__ import annotations

import json

import pytest

from core.config import NightConfig
from core.storage.embedder import MiniLMEmbedder
from core.storage.events import REFERENCE, Event
from core.storage.schema import Episode, StoredStep
from core.storage.store import Store
from tests.test_night_judge import REPORT, config_for, report, run, serve, tool_episode
from trainer.advantages import episode_row
from trainer.judge import Message, SubTask
from trainer.rewards import (
    group_relative,
    looped,
    person_reward,
    read_verifier_event,
    task_advantages,
    verifier_rewards,
)


@pytest.fixture(scope="module")
def embedder():
    return MiniLMEmbedder()


@pytest.fixture
async def store(tmp_path):
    s = await Store.open(tmp_path / "store.db")
    yield s
    await s.close()


def always(score: int):
    """A judge that reports every window's first four messages with one score."""
    def answer(kind, body):
        if kind == REPORT:
            return report([{"start": 0, "end": 3, "description": "the task", "score": score}])
        if kind == "understanding":
            return {"agent_understood": 2, "user_understood": 2}
        return {"score": 0, "length": 2}
    return answer


def by_channel(result) -> dict:
    return {s.channel: s for s in result.subtasks}


async def test_a_check_outranks_a_label_which_outranks_the_step_limit_which_outranks_the_judge(
        store, tmp_path, embedder):
    checked, _, _ = await tool_episode(store, "checked")
    await store.add_label(checked, "rejected", "reaction")  # a check that ran outranks the label
    await store.add_event("checked", checked, Event.VERIFIER_REWARD, {"reward": 0.0, "check": "exact"})
    await store.add_event("checked", checked, Event.VERIFIER_REWARD, {"reward": 1.0, "check": "exact"})
    relabelled, _, _ = await tool_episode(store, "relabelled")
    await store.add_label(relabelled, "accepted", "reaction")
    await store.add_label(relabelled, "rejected", "reaction")  # the latest label wins
    await tool_episode(store, "looped", status="aborted")
    rescued, _, _ = await tool_episode(store, "rescued", status="aborted")
    await store.add_label(rescued, "accepted", "admin")
    await tool_episode(store, "plain")
    server = await serve(always(2))  # the judge likes everything
    try:
        result, _ = await run(config_for(tmp_path, understanding_fraction=1.0), store, server,
                              embedder)
    finally:
        await server.stop()
    got = {c: (s.source, s.check, s.reward) for c, s in by_channel(result).items()}
    assert got == {"checked": ("verifier", "exact", 1.0),
                   "relabelled": ("person", "label", -1.0),
                   "looped": ("verifier", "step-limit", -1.0),
                   "rescued": ("person", "label", 1.0),
                   "plain": ("judge", "", 1.0)}
    assert len(server.of(REPORT)) == 5  # every episode judged, blind
    assert result.counts["subtasks_overridden"] == 4
    assert result.manifest["reward_sources"] == {"verifier": 2, "person": 2, "judge": 1}
    # The night report's figures: each source's mean and spread, and the eligible count.
    assert result.rewards == {"judge": {"n": 1, "mean": 1.0, "spread": 0.0},
                              "person": {"n": 2, "mean": 0.0, "spread": 1.0},
                              "verifier": {"n": 2, "mean": 0.0, "spread": 1.0}}
    assert result.counts["eligible"] == result.counts["episodes_total"] == 5
    # A check or a label rules its episode, so the understanding pass reads only "plain".
    assert len(server.of("understanding")) == 1


async def test_the_judge_is_measured_against_labels_and_checks(store, tmp_path, embedder):
    for channel, label in (("good", "accepted"), ("bad", "rejected"), ("worse", "rejected")):
        episode, _, _ = await tool_episode(store, channel)
        await store.add_label(episode, label, "reaction")
    checked, _, _ = await tool_episode(store, "checked")
    await store.add_event("checked", checked, Event.VERIFIER_REWARD, {"reward": 0.0, "check": "regex"})
    await tool_episode(store, "unlabelled")
    server = await serve(always(1))  # the judge calls every answer good
    try:  # every checked channel read too (by default a sample of them)
        result, _ = await run(config_for(tmp_path, judge_checked_fraction=1.0), store, server,
                              embedder)
    finally:
        await server.stop()
    assert result.agreement["person"] == {"n": 3, "agree": 1, "percent": 33.3, "uncovered": 0}
    assert result.agreement["verifier"] == {"n": 1, "agree": 0, "percent": 0.0, "uncovered": 0}
    assert result.manifest["judge_agreement"] == result.agreement


async def test_the_judge_skips_channels_a_check_rewarded_but_reads_every_labelled_one(
        store, tmp_path, embedder):
    for k in range(3):  # practice: each attempt a channel, each rewarded by its check
        episode, _, _ = await tool_episode(store, f"practice-{k}")
        await store.add_event(f"practice-{k}", episode, Event.VERIFIER_REWARD,
                              {"reward": 1.0 * (k == 0), "check": "exact", "group": "g"})
    both, _, _ = await tool_episode(store, "both")
    await store.add_event("both", both, Event.VERIFIER_REWARD, {"reward": 1.0, "check": "exact"})
    await store.add_label(both, "accepted", "reaction")
    await tool_episode(store, "chat")
    server = await serve(always(1))
    try:
        result, _ = await run(config_for(tmp_path, judge_checked_fraction=0.0), store, server,
                              embedder)
    finally:
        await server.stop()
    assert len(server.of(REPORT)) == 2  # "both" (a label: judged blind) and "chat"
    assert result.counts["channels_checked_unjudged"] == 3
    sources = {c: s.source for c, s in by_channel(result).items()}
    assert sources == {"practice-0": "verifier", "practice-1": "verifier",
                       "practice-2": "verifier", "both": "verifier", "chat": "judge"}
    # A practice group's mean is its baseline: the value model is not asked for them.
    assert result.counts["predictions"] == 2  # "both" and "chat", not the three attempts
    assert result.agreement["verifier"]["uncovered"] == 3


async def test_a_checked_attempt_always_trains_whatever_the_eval_share(store, tmp_path,
                                                                         embedder):
    for k in range(6):
        episode, _, _ = await tool_episode(store, f"practice-{k}")
        await store.add_event(f"practice-{k}", episode, Event.VERIFIER_REWARD,
                              {"reward": 1.0 * (k % 2), "check": "exact", "group": "g"})
        await tool_episode(store, f"chat-{k}")
    server = await serve(always(1))
    try:
        result, _ = await run(config_for(tmp_path, eval_percent=50), store, server, embedder)
    finally:
        await server.stop()
    rows = [json.loads(line) for line in result.dataset.read_text().splitlines()]
    splits = {r["channel"]: r["split"] for r in rows if r["kind"] == "episode"}
    assert all(splits[f"practice-{k}"] == "train" for k in range(6))
    assert "eval" in {splits[f"chat-{k}"] for k in range(6)}  # the share applies to the rest


async def test_imitate_passing_adds_a_mixed_groups_passing_attempts_to_what_is_imitated(
        store, tmp_path, embedder):
    """night.imitate_passing: best-of-G fine-tuning beside OAPL. The attempts that passed
    in a group whose attempts differ are imitated and keep their advantages; the failing
    ones, and a group that all passed, are not imitated."""
    for k, (group, reward) in enumerate((("g", 1.0), ("g", 0.0), ("g", 0.0),
                                         ("same", 1.0), ("same", 1.0))):
        episode, _, _ = await tool_episode(store, f"practice-{k}")
        await store.add_event(f"practice-{k}", episode, Event.VERIFIER_REWARD,
                              {"reward": reward, "check": "exact", "group": group})
    config = config_for(tmp_path)
    config.night.imitate_passing = True
    server = await serve(always(1))
    try:
        result, _ = await run(config, store, server, embedder)
    finally:
        await server.stop()
    rows = {r["channel"]: r for r in map(json.loads, result.dataset.read_text().splitlines())
            if r["kind"] == "episode"}
    judged = [i for i, a in enumerate(rows["practice-0"]["advantages"]) if a is not None]
    assert judged and rows["practice-0"]["imitate"] == judged
    assert all(rows[f"practice-{k}"]["imitate"] == [] for k in (1, 2, 3, 4))
    assert result.counts["imitated_passing"] == 1


async def test_rejected_and_aborted_episodes_are_trained_as_negatives(store, tmp_path, embedder):
    good, _, _ = await tool_episode(store, "good")
    await store.add_label(good, "accepted", "reaction")
    bad, _, _ = await tool_episode(store, "bad")
    await store.add_label(bad, "rejected", "reaction")
    looped, _, _ = await tool_episode(store, "looped", status="aborted")
    server = await serve(always(2))
    try:
        result, _ = await run(config_for(tmp_path), store, server, embedder)
    finally:
        await server.stop()
    rows = {r["episode_id"]: r for r in map(json.loads, result.dataset.read_text().splitlines())
            if r["kind"] == "episode"}
    assert set(rows) == {good, bad, looped}
    assert rows[looped]["reward_source"] == {"source": "verifier", "check": "step-limit",
                                             "reward": -1.0, "looped": False}
    assert rows[bad]["reward_source"] == {"source": "person", "check": "label", "reward": -1.0,
                                          "looped": False}
    judged = {e: [a for a in r["advantages"] if a is not None] for e, r in rows.items()}
    assert all(a > 0 for a in judged[good]) and len(judged[good]) == 2
    assert all(a < 0 for a in judged[bad] + judged[looped])
    # r_hat = 0, length 2 = len_hat: A_task = r; the turn penalty 0.02 on each, then centred
    table = {(r["episode_id"], r["step_id"]): r for r in await store.advantages(1)}
    looped_parts = [r["parts"] for (e, _), r in table.items() if e == looped]
    assert looped_parts[0]["task"] == -1.0 and looped_parts[0]["turn_penalty"] == -0.02
    assert looped_parts[0]["centre"] == pytest.approx(-(1 - 1 - 1 - 3 * 0.02) / 3)


async def test_practice_attempts_of_one_task_are_measured_against_their_group_mean(
        store, tmp_path, embedder):
    for i, reward in enumerate((1.0, 0.0, 1.0)):
        channel = f"practice-{i}"
        episode, _, _ = await tool_episode(store, channel)
        await store.add_event(channel, episode, Event.VERIFIER_REWARD,
                              {"reward": reward, "check": "exact", "task": "t1", "group": "run1:t1"})
    single, _, _ = await tool_episode(store, "single")
    await store.add_event("single", single, Event.VERIFIER_REWARD,
                          {"reward": 1.0, "check": "exact", "group": "run1:t2"})
    server = await serve(always(0))  # value model: score 0, length 2
    try:
        result, _ = await run(config_for(tmp_path), store, server, embedder)
    finally:
        await server.stop()
    tasks = {r["episode_id"]: r["parts"]["task"] for r in await store.advantages(1)}
    # rewards 1, -1, 1 around their mean 1/3 (equal lengths: no length term)
    assert [round(tasks[e], 6) for e in sorted(tasks)[:3]] == [0.666667, -1.333333, 0.666667]
    assert tasks[single] == 1.0  # a group of one falls back to the value model (r_hat = 0)


async def test_an_attempt_that_loops_fails_whatever_its_check_gave(store, tmp_path, embedder):
    """A check sees the outcome: "the right file, the wrong content" (0.5) for a file whose
    content repeats one sentence would rise above peers that wrote nothing. A loop is held
    down to the step limit's reward; a person's label on an unchecked loop still rules."""
    loop = "The file has been written to the file. " * 12
    for i, (reward, answer) in enumerate(((0.5, loop), (0.0, "I could not."), (0.0, "No."))):
        channel = f"practice-{i}"
        episode, _, _ = await tool_episode(store, channel, answer=answer)
        await store.add_event(channel, episode, Event.VERIFIER_REWARD, {
            "reward": reward, "check": "python:f.py", "task": "t1", "group": "run1:t1"})
    liked, _, _ = await tool_episode(store, "liked", answer=loop)
    await store.add_label(liked, "accepted", "reaction")
    server = await serve(always(2))
    try:
        result, _ = await run(config_for(tmp_path), store, server, embedder)
    finally:
        await server.stop()
    got = {c: (s.source, s.check, s.reward, s.looped) for c, s in by_channel(result).items()}
    assert got["practice-0"] == ("verifier", "python:f.py", -1.0, True)
    assert got["practice-1"] == ("verifier", "python:f.py", -1.0, False)
    assert got["liked"] == ("person", "label", 1.0, False)
    assert result.counts["looped"] == 1
    # All three attempts now failed alike: the group is held by its first, nothing pushed up.
    tasks = {r["episode_id"]: r["parts"]["task"] for r in await store.advantages(1)
             if "task" in r["parts"]}
    assert not any(a > 0 for e, a in tasks.items() if e != liked)


def test_a_loop_in_a_calls_arguments_is_a_loop():
    def said(content="", calls=None):
        return Message(0, 1, 1, "assistant", content, calls)

    written = json.dumps({"path": "lemon.txt", "content": "It is done. " * 15})
    call = [{"id": "c", "type": "function", "function": {"name": "write_file",
                                                         "arguments": written}}]
    assert looped([said(calls=call)])
    lines = json.dumps({"path": "log.txt", "content": "ok\n" * 30})  # escaped newlines
    assert looped([said(calls=[{"function": {"name": "write_file", "arguments": lines}}])])
    assert looped([said("we go round, " * 10, calls=[{"function": {"name": "list_dir",
                                                                   "arguments": "{}"}}])])
    assert looped([said("fine"), said("again and again, " * 10)])
    assert not looped([said("The capital of France is Paris, a city on the Seine.")])
    harness = Message(0, 1, 1, "assistant", "no no no no " * 10, None, harness=True)
    assert not looped([harness])  # the stray-turn probe's answer is the harness's text


def test_the_verifier_event_contract():
    ok = read_verifier_event({"reward": 0.75, "check": "regex", "task": "a", "group": "g"})
    assert (ok.reward, ok.check, ok.task, ok.group) == (0.5, "regex", "a", "g")
    for payload, error in (({"reward": None, "check": "python:f.py", "error": "timed out"}, "timed out"),
                           ({"check": "exact"}, "no reward"),
                           ({"reward": 1.5, "check": "exact"}, "not a number in [0, 1]"),
                           ({"reward": True, "check": "exact"}, "not a number in [0, 1]"),
                           ({"reward": float("nan"), "check": "exact"}, "not a number"),
                           ({"reward": "1", "check": "exact"}, "not a number"),
                           ({"reward": 1.0}, "names no check")):
        unjudged = read_verifier_event(payload)
        assert unjudged.reward is None and error in unjudged.error, payload
    events = [{"id": 2, "episode_id": 7, "payload": {"reward": 0.0, "check": "exact"}},
              {"id": 1, "episode_id": 7, "payload": {"reward": 1.0, "check": "exact"}},
              {"id": 3, "episode_id": None, "payload": {"reward": 1.0, "check": "exact"}}]
    assert {e: v.reward for e, v in verifier_rewards(events).items()} == {7: -1.0}


def test_the_latest_person_label_wins():
    assert person_reward(["accepted", "rejected"]) == -1.0
    assert person_reward(["rejected", "verified"]) == 1.0
    assert person_reward([]) is None


def _step(i: int, role: str, content: str = "", probe: bool = False, calls=None) -> StoredStep:
    return StoredStep(role=role, content=content, tool_calls=calls,
                      meta={"probe": "stray"} if probe else None,
                      id=100 + i, episode_id=1, channel_id="c", seq=i, created_at=0.0)


def test_the_stray_probe_is_listed_as_harness_and_gets_no_advantage():
    steps = [_step(0, "system", "sys"), _step(1, "user", "do it"), _step(2, "assistant", "done?"),
             _step(3, "user", "Did you mean to end your turn?", probe=True),
             _step(4, "assistant", '{"answer": "no"}', probe=True),
             _step(5, "user", "Then continue", probe=True), _step(6, "assistant", "Done.")]
    episode = Episode(1, "c", 0.0, 1.0, "complete", None, steps)
    covered = {s.id: [0.5] for s in steps if s.role == "assistant"}
    row, table = episode_row(episode, "train", covered, None, {102}, NightConfig())
    assert row["harness"] == [3, 4, 5]
    assert row["advantages"] == [None, None, pytest.approx(0.48), None, None, None,
                                 pytest.approx(0.48)]  # 0.5 minus one extra turn's 0.02
    assert [t["step_id"] for t in table] == [102, 106]
    assert row["token_overrides"] == [{"message": 2, "token": -1, "advantage": -1.0}]


def test_the_night_reads_the_practice_runners_events_as_verifier_rewards():
    from trainer.rewards import read_verifier_event

    base = {"task": "add", "task_id": "add", "set": "drill", "group": "drill:add:1",
            "check": "exact"}
    judged = read_verifier_event({**base, "reward": 1.0})
    assert (judged.reward, judged.group, judged.task) == (1.0, "drill:add:1", "add")
    assert read_verifier_event({**base, "reward": 0.0}).reward == -1.0
    unjudged = read_verifier_event({**base, "reward": None, "error": "the check timed out",
                                    "why": "the check timed out"})
    assert unjudged.reward is None and "timed out" in unjudged.error


def test_a_demonstration_is_listed_for_imitation_and_left_out_of_oapl():
    steps = [_step(0, "system", "sys"), _step(1, "user", "What is 3 times 9?"),
             _step(2, "assistant", "27")]
    steps[2].meta = {"demonstration": True}
    demo = Episode(1, "c", 0.0, 1.0, "complete", None, steps)
    demo_row, table = episode_row(demo, "train", {102: [0.8]}, None, set(), NightConfig())
    assert demo_row["imitate"] == [2] and demo_row["advantages"][2] is None
    assert table[0]["advantage"] == pytest.approx(0.8)  # the report still shows a value given


def _attempt(k: int, reward: float, length: int = 1, check: str = "exact") -> SubTask:
    return SubTask("c", 0, 1, "3 times 9", reward, length, "verifier", f"e{k}", check, "drill:t:1")


def test_a_group_that_all_failed_is_held_by_one_attempt_and_its_reference_has_none():
    """Pushed down whole, a failed group pushes down what its attempts did right too: its
    first attempt is held where it is (advantage 0, OAPL's KL term), the others get none,
    whatever their lengths; the reference (check "reference") is imitated, not in the mean."""
    subtasks = [*(_attempt(k, -1.0, length=k) for k in range(4)),
                _attempt(9, 1.0, check=REFERENCE)]
    assert task_advantages(subtasks, {}, NightConfig()) == {"e0": 0.0}
    assert group_relative(subtasks)["drill:t:1"] == subtasks[:4]


def test_without_anchor_demonstrated_a_shown_group_holds_none_and_an_unshown_one_still_does():
    """The anchor of a group shown by its reference holds the answer the reference replaces;
    night.anchor_demonstrated = false drops it there, and only there."""
    shown = [*(_attempt(k, -1.0) for k in range(4)), _attempt(9, 1.0, check=REFERENCE)]
    unshown = [SubTask("c", 0, 1, "p", -1.0, 1, "verifier", f"u{k}", "python", "drill:u:1")
               for k in range(3)]
    off = NightConfig(anchor_demonstrated=False)
    assert task_advantages(shown + unshown, {}, off) == {"u0": 0.0}
    assert task_advantages(shown + unshown, {}, NightConfig()) == {"e0": 0.0, "u0": 0.0}


def test_a_mixed_group_is_measured_against_its_attempts_mean_not_its_reference():
    subtasks = [_attempt(0, 1.0), *(_attempt(k, -1.0) for k in (1, 2, 3)),
                _attempt(9, 1.0, check=REFERENCE)]
    advantages = task_advantages(subtasks, {}, NightConfig())
    assert advantages == {"e0": pytest.approx(1.5), "e1": pytest.approx(-0.5),
                          "e2": pytest.approx(-0.5), "e3": pytest.approx(-0.5)}


def test_centring_leaves_rows_measured_against_their_group():
    """A group's long failed attempt (seven messages) beside its one-message success would
    outweigh it in a per-message mean; group rows are relative already and stay as they are."""
    from trainer.advantages import centre

    def row(episode_id, advantages, grouped):
        return {"kind": "episode", "episode_id": episode_id, "split": "train",
                "advantages": list(advantages), "group_baseline": grouped}

    success, loop = row(1, [None, 1.5], True), row(2, [None] + [-0.5] * 7, True)
    chat = [row(3, [None, 0.4], False), row(4, [None, -0.2], False)]
    table = [{"episode_id": e, "advantage": a, "parts": {}} for e, a in ((1, 1.5), (3, 0.4))]
    assert centre([success, loop, *chat], table) == pytest.approx(0.1)
    assert success["advantages"] == [None, 1.5] and loop["advantages"][1:] == [-0.5] * 7
    assert [r["advantages"][1] for r in chat] == [pytest.approx(0.3), pytest.approx(-0.3)]
    assert table[0] == {"episode_id": 1, "advantage": 1.5, "parts": {}}
    assert table[1]["parts"]["centre"] == pytest.approx(-0.1)


async def test_the_judge_reads_at_most_judge_checked_max_checked_channels(store, tmp_path, embedder):
    for k in range(5):
        episode, _, _ = await tool_episode(store, f"practice-{k}")
        await store.add_event(f"practice-{k}", episode, Event.VERIFIER_REWARD,
                              {"reward": 1.0, "check": "exact", "group": "g"})
    await tool_episode(store, "chat")  # no check: always read, outside the cap
    server = await serve(always(1))
    try:
        result, _ = await run(config_for(tmp_path, judge_checked_fraction=1.0,
                                         judge_checked_max=2), store, server, embedder)
    finally:
        await server.stop()
    assert len(server.of(REPORT)) == 3  # two of the five checked channels, and "chat"
    assert result.counts["channels_checked_unjudged"] == 3
    assert result.agreement["verifier"]["n"] == 2
