"""Admin commands on Discord: ``!sleep``, the plain admin functions, the slash wrappers.

``run_admin`` (permission check + action) is tested directly; each slash
command is then called through ``bot.tree``'s callback with a real
Interaction, and what it answered is read from the recorder (see
tests/discord_helpers.py).
"""

from __future__ import annotations

import discord.ext.test as dpytest
import pytest
from discord.ext.test import backend

from bot.commands import Caller
from bot.commands import COMMANDS as ACTIONS, REFUSAL, run_command as run_admin
from core.config.routines import Swarm
from tests.discord_helpers import (
    discord_env_fixture,  # noqa: F401 - a fixture
    labels,
    make_config,
    make_member,
    recorder_fixture,  # noqa: F401 - a fixture
    sent_messages,
    start_runtime,
)
from tests.scripted import ScriptedLLM, say
from tools.system import SECTION_FILE

ALICE = Caller(1, (), "c1", "alice (1)")  # an admin by user id
BOB = Caller(2, (3,), "c1", "bob (2)")


# -- !sleep ----------------------------------------------------------------------------


async def test_sleep_command_from_an_admin_queues_a_night(discord_env):
    h = await discord_env([])
    await dpytest.message("!sleep", channel=h.general, member=h.alice)  # no mention needed
    [reply] = sent_messages()
    assert reply.content.startswith("Going to sleep: night job #1")
    [job] = await h.rt.store.jobs("sleep")
    assert job["state"] == "queued" and job["args"]["channel"] == str(h.general.id)
    assert str(h.alice.id) in job["args"]["requested_by"]
    assert h.llm.calls == []  # a command never reaches the agent
    assert h.rt.night.launched == [job["id"]]  # the trainer process was started for it


async def test_night_progress_is_edited_into_one_message_in_the_asking_channel(discord_env):
    h = await discord_env([])
    await dpytest.message("!sleep", channel=h.general, member=h.alice)
    [job] = await h.rt.store.jobs("sleep")
    await h.rt.store.update_job(job["id"], state="judging")
    await h.bot.night_progress(await h.rt.store.job(job["id"]))
    await h.rt.store.update_job(job["id"], state="training",
                                progress={"train_step": {"step": 3, "steps": 8, "oapl": 0.25}})
    await h.bot.night_progress(await h.rt.store.job(job["id"]))
    messages = [m async for m in h.general.history(limit=10)]
    progress = [m for m in messages if m.content.startswith(f"Night #{job['id']}")]
    assert len(progress) == 1
    assert progress[0].content == f"Night #{job['id']}: training · step 3/8, OAPL 0.2500"


async def test_sleep_command_from_a_non_admin_is_refused_politely(discord_env):
    h = await discord_env([])
    await dpytest.message("!sleep", channel=h.free, member=h.bob)
    assert [m.content for m in sent_messages()] == [REFUSAL]
    assert await h.rt.store.jobs("sleep") == [] and h.llm.calls == []


# -- the plain functions ------------------------------------------------------------------

ADMIN_CASES = {  # command -> (options, what the answer starts with); run in this order
    "status": ({}, "model: base (base.gguf)"),
    "sleep": ({}, "Going to sleep: night job #1"),
    "wake": ({}, "Cancelled night job(s) #1."),  # the night "sleep" just queued
    "promote": ({"release_id": None}, "No candidate release to promote."),
    "rollback": ({"release_id": 7}, "Release #7 is not a retired release."),
    "label": ({"episode_id": 1, "label": "verified"}, "Episode #1 labelled verified."),
    "forget": ({"episode_id": 1}, "Episode #1 is forgotten"),
    "sys show": ({}, "(this channel's editable system section is empty)"),
    "sys reset": ({}, "This channel's editable system section was reset"),
    "restart-server": ({}, "Model server restarted (pid 4243)."),
    "notes-clean": ({}, "Routine cleaning (episode #2): 0 notes before, 0 after.\nhi"),
    "notes-wipe": ({}, "Nothing deleted. /notes-wipe deletes all 0 notes"),
    "swarm start": ({"swarm": "team", "task": "count the files"},
                    "Swarm team started on board post #1: 2 of 2 channels are working on it."),
    "swarm stop": ({"swarm": "team"}, "Swarm team's task is cleared"),
    "practice": ({"file": "/no/such/set.jsonl"}, "practice: cannot read the practice set"),
    "selfplay start": ({"rounds": 0}, "selfplay start: ROUNDS must be between 1 and 100"),
    "selfplay stop": ({}, "No self-play is running."),
    "history": ({}, "No release yet"),
    "report": ({"night": None}, "**Night #1 report** (cancelled"),  # the night /wake ended
}


@pytest.fixture
async def rt(tmp_path):
    """A runtime with one episode (#1) in channel c1; user 1 and role 77 are admins;
    the swarm "team" is channels s1 and s2. The model answers "hi" to everything."""
    config = make_config(tmp_path, admin_user_ids=[1], admin_role_ids=[77])
    config.swarms.teams = [Swarm(name="team", channels=["s1", "s2"])]
    rt = await start_runtime(config, ScriptedLLM(lambda messages, kwargs: say("hi")))
    await rt.turn("c1", "hello")
    yield rt
    await rt.close()


async def test_every_admin_action_runs_for_an_admin(rt):
    assert set(ADMIN_CASES) == set(ACTIONS)
    for name, (options, expected) in ADMIN_CASES.items():
        answer = await run_admin(rt, ALICE, name, **options)
        assert not answer.refused and answer.text.startswith(expected), (name, answer)
    assert rt.supervisor.restarts == 1
    assert labels(rt.config) == [(1, "verified", "admin")]


async def test_an_admin_role_is_enough(rt):
    answer = await run_admin(rt, Caller(5, (77,), "c1", "eve (5)"), "wake")
    assert answer.text == "No night is queued or running."


async def test_every_admin_action_is_refused_to_a_non_admin(rt):
    for name, (options, _) in ADMIN_CASES.items():
        answer = await run_admin(rt, BOB, name, **options)
        assert answer.refused and answer.text == ACTIONS[name].refusal
    assert await rt.store.jobs("sleep") == [] and rt.supervisor.restarts == 0
    assert labels(rt.config) == []


async def test_an_admin_action_that_raises_answers_its_error(rt):
    async def broken(reason):
        raise RuntimeError("no GPU left")

    rt.supervisor.restart = broken
    answer = await run_admin(rt, ALICE, "restart-server")
    assert answer.text == "restart-server failed: no GPU left"


# -- the slash wrappers -------------------------------------------------------------------

SLASH_CASES = [  # (path in the tree, callback kwargs, interaction options, expected start)
    (["status"], {}, [], "model: base (base.gguf)"),
    (["sleep"], {}, [], "Going to sleep: night job #1"),
    (["wake"], {}, [], "No night is queued or running."),
    (["promote"], {}, [], "No candidate release to promote."),
    (["rollback"], {"release_id": 3}, [{"name": "release_id", "type": 4, "value": 3}],
     "Release #3 is not a retired release."),
    (["label"], {"episode_id": 99, "label": "accepted"},
     [{"name": "episode_id", "type": 4, "value": 99},
      {"name": "label", "type": 3, "value": "accepted"}], "Not labelled: no episode 99"),
    (["forget"], {"episode_id": 99}, [{"name": "episode_id", "type": 4, "value": 99}],
     "forget: no episode 99"),
    (["sys", "show"], {}, [], "(this channel's editable system section is empty)"),
    (["sys", "reset"], {}, [], "This channel's editable system section was reset"),
    (["restart-server"], {}, [], "Model server restarted"),
    (["notes-clean"], {}, [], "Routine cleaning (episode #1): 0 notes before, 0 after."),
    (["notes-wipe"], {"confirm": "CONFIRM"}, [{"name": "confirm", "type": 3, "value": "CONFIRM"}],
     "Wiped 0 notes of this channel."),
    (["swarm", "start"], {"swarm": "team", "task": "go"},
     [{"name": "swarm", "type": 3, "value": "team"}, {"name": "task", "type": 3, "value": "go"}],
     "swarm start: no swarms are configured"),
    (["swarm", "stop"], {"swarm": "team"}, [{"name": "swarm", "type": 3, "value": "team"}],
     "swarm stop: no swarms are configured"),
    (["practice"], {"file": "/no/such/set.jsonl", "samples": 2},
     [{"name": "file", "type": 3, "value": "/no/such/set.jsonl"},
      {"name": "samples", "type": 4, "value": 2}], "practice: cannot read the practice set"),
    (["selfplay", "start"], {"rounds": 1, "solvers": 99},
     [{"name": "rounds", "type": 4, "value": 1}, {"name": "solvers", "type": 4, "value": 99}],
     "selfplay start: --solvers must be between 1 and 16"),
    (["selfplay", "stop"], {}, [], "No self-play is running."),
    (["history"], {}, [], "No release yet"),
    (["report"], {"night": 5}, [{"name": "night", "type": 4, "value": 5}],
     "report: no night has run yet"),
]
SLASH_IDS = [" ".join(case[0]) for case in SLASH_CASES]


def tree_command(bot, path: list[str]):
    command = bot.tree.get_command(path[0])
    for name in path[1:]:
        command = command.get_command(name)
    return command


def data_options(path: list[str], options: list[dict]) -> list[dict]:
    """A subcommand's options nest under it, as Discord sends them."""
    return [{"name": path[1], "type": 1, "options": options}] if len(path) > 1 else options


async def test_every_admin_slash_command_is_registered_and_guild_only(discord_env):
    h = await discord_env([])
    commands = h.bot.tree.get_commands()
    assert {c.name for c in commands} == {"status", "sleep", "wake", "promote", "rollback",
                                          "label", "forget", "sys", "restart-server",
                                          "notes-clean", "notes-wipe", "swarm", "practice",
                                          "selfplay", "history", "report"}
    assert all(c.guild_only for c in commands)
    assert {c.name for c in tree_command(h.bot, ["sys"]).commands} == {"show", "reset"}
    assert {c.name for c in tree_command(h.bot, ["swarm"]).commands} == {"start", "stop"}
    assert {c.name for c in tree_command(h.bot, ["selfplay"]).commands} == {"start", "stop"}


@pytest.mark.parametrize("path,kwargs,options,expected", SLASH_CASES, ids=SLASH_IDS)
async def test_admin_slash_command_answers_an_admin(discord_env, recorder, path, kwargs,
                                                    options, expected):
    h = await discord_env([say("hi")])  # the reply of notes-clean's routine cleaning turn
    interaction = recorder.interaction(h.bot, h.alice, h.general, path[0],
                                       data_options(path, options))
    await tree_command(h.bot, path).callback(interaction, **kwargs)
    assert [s.kind for s in recorder.sent] == ["deferred", "followup"]
    assert not any(s.ephemeral for s in recorder.sent)
    assert recorder.sent[1].content.startswith(expected)


@pytest.mark.parametrize("path,kwargs,options,expected", SLASH_CASES, ids=SLASH_IDS)
async def test_admin_slash_command_refuses_a_non_admin_ephemerally(discord_env, recorder, path,
                                                                   kwargs, options, expected):
    h = await discord_env([])
    interaction = recorder.interaction(h.bot, h.bob, h.general, path[0],
                                       data_options(path, options))
    await tree_command(h.bot, path).callback(interaction, **kwargs)
    refusal = ACTIONS[" ".join(path)].refusal  # REFUSAL, or /forget's own
    assert [(s.kind, s.content, s.flags) for s in recorder.sent] == [("message", refusal, 64)]
    assert await h.rt.store.jobs("sleep") == [] and h.rt.supervisor.restarts == 0


async def test_an_admin_role_grants_the_slash_commands(discord_env, recorder):
    h = await discord_env([])
    night_shift = backend.make_role("night-shift", h.general.guild)
    carol = make_member("carol", h.general.guild, roles=[night_shift])
    h.rt.config.discord.admin_role_ids = [night_shift.id]
    await tree_command(h.bot, ["wake"]).callback(
        recorder.interaction(h.bot, carol, h.general, "wake"))
    assert [s.kind for s in recorder.sent] == ["deferred", "followup"]
    assert recorder.sent[1].content == "No night is queued or running."


async def test_a_long_slash_answer_is_split_over_followups(discord_env, recorder):
    h = await discord_env([])
    section = "\n".join(f"rule {i}: be brief and exact in every single answer" for i in range(70))
    (h.rt.spaces.context(str(h.general.id)).state_dir / SECTION_FILE).write_text(section)
    await tree_command(h.bot, ["sys", "show"]).callback(
        recorder.interaction(h.bot, h.alice, h.general, "sys",
                             data_options(["sys", "show"], [])))
    followups = [s.content for s in recorder.sent if s.kind == "followup"]
    assert len(followups) >= 2 and all(len(f) <= 2000 for f in followups)


class FakeAttachment:
    """What the slash wrapper reads of a discord.Attachment."""

    def __init__(self, filename: str, data: bytes) -> None:
        self.filename, self.data, self.size = filename, data, len(data)

    async def read(self) -> bytes:
        return self.data


async def test_practice_takes_its_set_as_an_attachment_saved_under_uploads(discord_env,
                                                                          recorder):
    h = await discord_env([])
    bad_set = FakeAttachment("../drill.jsonl", b'{"id": "a", "prompt": "p"\n')
    interaction = recorder.interaction(h.bot, h.alice, h.general, "practice", [])
    await tree_command(h.bot, ["practice"]).callback(interaction, file_attachment=bad_set)
    saved = h.rt.config.data_dir / "uploads" / f"{interaction.id}-drill.jsonl"
    assert saved.read_bytes() == bad_set.data
    # The saved file went through the practice set's parser: its error names the line.
    assert f"{saved}:1: not valid JSON" in recorder.sent[1].content


async def test_practice_without_a_path_or_an_attachment_says_how_to_give_one(discord_env,
                                                                            recorder):
    h = await discord_env([])
    interaction = recorder.interaction(h.bot, h.alice, h.general, "practice", [])
    await tree_command(h.bot, ["practice"]).callback(interaction)
    assert recorder.sent[1].content.startswith(
        "practice: give FILE as a path on the bot's machine, or attach the file")


async def test_an_attachment_from_a_non_admin_is_never_saved(discord_env, recorder):
    h = await discord_env([])
    interaction = recorder.interaction(h.bot, h.bob, h.general, "practice", [])
    await tree_command(h.bot, ["practice"]).callback(
        interaction, file_attachment=FakeAttachment("x.jsonl", b"{}"))
    assert [s.content for s in recorder.sent] == [REFUSAL]
    assert not (h.rt.config.data_dir / "uploads").exists()


async def test_a_blocked_user_or_channel_gets_no_slash_command_not_even_forget(discord_env,
                                                                            recorder):
    """Slash commands skipped the block lists: a blocked user kept /forget (issue 40)."""
    h = await discord_env([])
    h.rt.config.discord.blocked_user_ids = [h.alice.id]
    await tree_command(h.bot, ["status"]).callback(
        recorder.interaction(h.bot, h.alice, h.general, "status"))
    h.rt.config.discord.blocked_user_ids = []
    h.rt.config.discord.blocked_channel_ids = [h.general.id]
    await tree_command(h.bot, ["forget"]).callback(
        recorder.interaction(h.bot, h.bob, h.general, "forget",
                             [{"name": "episode_id", "type": 4, "value": 1}]), episode_id=1)
    assert [(s.kind, s.flags) for s in recorder.sent] == [("message", 64), ("message", 64)]
    assert recorder.sent[0].content == REFUSAL
