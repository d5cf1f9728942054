"""A person's share of a night's labels (``trainer.labellers``): past it, their labels are
set aside and the judge decides; the report says who labelled what."""

from __future__ import annotations

import pytest

from bot.night.report import labeller_line
from core.storage.embedder import MiniLMEmbedder
from core.storage.schema import Episode
from core.storage.store import Store
from tests.test_night_judge import REPORT, config_for, report, run, serve, tool_episode
from trainer.labellers import cap_labels, deciding_giver
from trainer.rewards import person_reward


def episode(i: int, labels: list[str], givers: list[int | None]) -> Episode:
    return Episode(id=i, channel_id="c", started_at=float(i), ended_at=None, status="complete",
                   model_version=None, labels=labels, labellers=givers)


def test_a_persons_labels_past_their_share_are_set_aside_in_the_order_episodes_started():
    episodes = [episode(i, ["accepted"], [7]) for i in range(5)]
    got = cap_labels(episodes, per_person=3)
    assert [person_reward(e.labels) for e in episodes] == [1.0, 1.0, 1.0, None, None]
    assert got == {"7": {"accepted": 3, "rejected": 0, "set_aside": 2}}


def test_another_standing_label_decides_when_the_latest_is_set_aside():
    # 9 labelled first (rejected), then 7 (accepted, the latest): 7 is past the share, so
    # the episode falls back to 9's label, not to the judge.
    episodes = [episode(0, ["accepted"], [7]), episode(1, ["rejected", "accepted"], [9, 7])]
    got = cap_labels(episodes, per_person=1)
    assert person_reward(episodes[1].labels) == -1.0
    assert episodes[1].labellers == [9]
    assert got == {"7": {"accepted": 1, "rejected": 0, "set_aside": 1},
                   "9": {"accepted": 0, "rejected": 1, "set_aside": 0}}


def test_admins_and_the_label_command_are_not_capped_and_other_labels_do_not_count():
    episodes = [episode(i, ["accepted"], [1]) for i in range(3)]
    episodes += [episode(3 + i, ["rejected"], [None]) for i in range(3)]
    episodes.append(episode(9, ["flagged"], [5]))  # no reward label: decides nothing
    got = cap_labels(episodes, per_person=0, trusted=[1])
    assert all(person_reward(e.labels) is not None for e in episodes[:6])
    assert got == {"1": {"accepted": 3, "rejected": 0, "set_aside": 0},
                   "admin command": {"accepted": 0, "rejected": 3, "set_aside": 0}}
    assert deciding_giver(episodes[-1]) is None


def test_the_report_line_names_each_giver_and_what_was_set_aside():
    line = labeller_line({"labellers": {"7": {"accepted": 3, "rejected": 1, "set_aside": 2}}})
    assert line == "Labels by giver: 7 3 ✅ 1 ❌, 2 set aside (past their share of the night)."
    assert labeller_line({}) == "Labels: none counted."


@pytest.fixture
async def store(tmp_path):
    s = await Store.open(tmp_path / "store.db")
    yield s
    await s.close()


async def test_a_night_lets_the_judge_decide_past_a_persons_share(store, tmp_path):
    """Through part 1 with a real store and a scripted judge that scores every window 0:
    one person's ✅ on three episodes, with a share of two, rules two of them."""
    for i in range(3):
        ep, _, _ = await tool_episode(store, f"chan-{i}")
        await store.add_label(ep, "accepted", "reaction", user_id=42)

    def neutral(kind, body):
        if kind == REPORT:
            return report([{"start": 0, "end": 3, "description": "the task", "score": 0}])
        return {"score": 0, "length": 2}

    server = await serve(neutral)
    try:
        result, _ = await run(config_for(tmp_path, labels_per_person=2), store, server,
                              MiniLMEmbedder())
    finally:
        await server.stop()
    sources = sorted((s.channel, s.source, s.reward) for s in result.subtasks)
    assert sources == [("chan-0", "person", 1.0), ("chan-1", "person", 1.0),
                       ("chan-2", "judge", 0.0)]
    assert result.labellers == {"42": {"accepted": 2, "rejected": 0, "set_aside": 1}}
