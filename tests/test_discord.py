"""The Discord front end through dpytest: who it answers, replies, files, busy, labels, commands.

Messages, ``!sleep`` and reactions go through dpytest's fake gateway and the
real Runtime (store, channel workers, agent, tools) with a scripted model.
Slash commands go through ``bot.tree``'s callbacks with real Interaction
objects (see tests/discord_helpers.py), and their plain functions directly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import discord
import discord.ext.test as dpytest
import pytest
from discord.ext.test import backend, factories

from bot import admin
from bot.discord_access import Caller, Origin, is_allowed, needs_mention
from bot.discord_admin import ACTIONS, REFUSAL, run_admin
from bot.discord_app import TURN_FAILED, NightshiftBot
from bot.discord_render import human_size, safe_name, save_attachments, split_reply
from bot.runtime import Runtime
from tests.discord_helpers import FakeSupervisor, InteractionRecorder, interaction, make_config
from tests.scripted import ScriptedLLM, call, say

CHECK, CROSS = "\N{WHITE HEAVY CHECK MARK}", "\N{CROSS MARK}"


@dataclass
class Harness:
    rt: Runtime
    bot: NightshiftBot
    llm: ScriptedLLM
    general: discord.TextChannel  # needs a mention
    free: discord.TextChannel  # listed in no_mention_channel_ids
    alice: discord.Member  # an admin
    bob: discord.Member  # an ordinary user

    @property
    def me(self) -> str:
        return self.bot.user.mention

    def prompts(self) -> list[str]:
        """The last user message of each model call: what the agent received."""
        return [next(m["content"] for m in reversed(msgs) if m["role"] == "user")
                for msgs, _ in self.llm.calls]

    async def labels(self) -> list[tuple[int, str, str]]:
        rows = await self.rt.store._fetch("SELECT episode_id, label, source FROM labels ORDER BY id")
        return [tuple(r) for r in rows]


@pytest.fixture
async def start(tmp_path, monkeypatch):
    """Start the runtime and the bot on dpytest with a scripted model: ``await start(script)``."""
    monkeypatch.chdir(tmp_path)  # dpytest writes files the bot sends to ./dpytest_N.dat
    made: list[tuple[Runtime, NightshiftBot]] = []

    async def _start(script, **discord_fields) -> Harness:
        config = make_config(tmp_path, **discord_fields)
        llm = ScriptedLLM(script)
        rt = await Runtime.start(config, supervisor=FakeSupervisor(tmp_path / "base.gguf"),
                                 llm=llm, start_server=False)
        bot = NightshiftBot(rt)
        made.append((rt, bot))
        await bot._async_setup_hook()
        dpytest.configure(bot, text_channels=["general", "free"], voice_channels=0,
                          members=["alice", "bob"])
        cfg = dpytest.get_config()
        general, free = cfg.channels
        alice, bob = cfg.members
        config.discord.no_mention_channel_ids = [free.id]
        config.discord.admin_user_ids = [alice.id]
        return Harness(rt, bot, llm, general, free, alice, bob)

    yield _start
    await dpytest.empty_queue()
    for rt, bot in made:
        await bot.close()
        await rt.close()


def sent_messages() -> list[discord.Message]:
    out = []
    while not dpytest.sent_queue.empty():
        out.append(dpytest.get_message())
    return out


def make_member(name: str, guild: discord.Guild, *, bot: bool = False,
                roles: list[discord.Role] | None = None) -> discord.Member:
    user = backend.get_state().store_user(
        factories.make_user_dict(name, "0042", None, factories.make_id(), bot=bot))
    return backend.make_member(user, guild, roles=roles)


# -- where it answers ------------------------------------------------------------------


async def test_a_server_message_needs_a_mention_unless_its_channel_needs_none(start):
    h = await start(lambda msgs, kw: say("hello"))
    await dpytest.message("anyone here?", channel=h.general, member=h.bob)
    assert sent_messages() == [] and h.llm.calls == []
    await dpytest.message(f"{h.me} anyone here?", channel=h.general, member=h.bob)
    await dpytest.message("and here?", channel=h.free, member=h.bob)
    assert [m.content for m in sent_messages()] == ["hello", "hello"]
    assert h.prompts() == ["anyone here?", "and here?"]  # the mention is stripped
    episodes = await h.rt.store.episodes_since(0)
    assert {e.channel_id for e in episodes} == {str(h.general.id), str(h.free.id)}


async def test_blocked_users_roles_and_channels_are_ignored_and_block_wins(start):
    h = await start(lambda msgs, kw: say("ok"))
    muted = backend.make_role("muted", h.general.guild)
    carol = make_member("carol", h.general.guild, roles=[muted])
    d = h.rt.config.discord
    d.blocked_user_ids = [h.bob.id]
    d.blocked_role_ids = [muted.id]
    d.allowed_user_ids = [h.bob.id, carol.id]  # an allow list never beats a block
    await dpytest.message("hi", channel=h.free, member=h.bob)
    await dpytest.message("hi", channel=h.free, member=carol)
    d.blocked_user_ids, d.blocked_role_ids = [], []
    d.blocked_channel_ids = [h.free.id]
    await dpytest.message("hi", channel=h.free, member=h.bob)
    assert sent_messages() == [] and h.llm.calls == []


async def test_allow_lists_limit_channels_and_users_but_not_admins(start):
    h = await start(lambda msgs, kw: say("ok"))
    d = h.rt.config.discord
    d.allowed_channel_ids = [h.general.id]
    await dpytest.message("hi", channel=h.free, member=h.bob)  # channel not allowed
    assert sent_messages() == []
    await dpytest.message("hi", channel=h.free, member=h.alice)  # admins pass allow lists
    assert [m.content for m in sent_messages()] == ["ok"]
    helpers = backend.make_role("helpers", h.general.guild)
    dave = make_member("dave", h.general.guild, roles=[helpers])
    d.allowed_channel_ids, d.allowed_role_ids = [], [helpers.id]
    await dpytest.message("hi", channel=h.free, member=h.bob)  # bob lacks the role
    await dpytest.message("hi", channel=h.free, member=dave)
    assert [m.content for m in sent_messages()] == ["ok"]


async def test_other_bots_and_the_bot_itself_are_ignored(start):
    h = await start(lambda msgs, kw: say("ok"))
    robot = make_member("robot", h.general.guild, bot=True)
    await dpytest.message("hi", channel=h.free, member=robot)
    backend.make_message("hi", h.bot.user, h.free)  # the bot's own message
    await dpytest.run_all_events()
    assert sent_messages() == [] and h.llm.calls == []


async def test_a_direct_message_is_answered_in_a_channel_keyed_by_the_user(start):
    h = await start(lambda msgs, kw: say("private hello"))
    dm = await h.bob.create_dm()
    await dpytest.message("hi in private", channel=dm, member=h.bob)  # no mention needed
    assert [m.content for m in sent_messages()] == ["private hello"]
    assert [e.channel_id for e in await h.rt.store.episodes_since(0)] == [f"dm-{h.bob.id}"]
    h.rt.config.discord.allow_dms = False
    await dpytest.message("hi again", channel=dm, member=h.bob)
    assert sent_messages() == [] and len(h.llm.calls) == 1


# -- replies ---------------------------------------------------------------------------


async def test_a_long_reply_with_a_code_block_is_split_without_breaking_the_block(start):
    code = "\n".join(f"print({i})  # a line of code that takes some room" for i in range(120))
    reply = "Here is the script:\n```python\n" + code + "\n```\nRun it with python."
    h = await start(lambda msgs, kw: say(reply))
    await dpytest.message("write a script", channel=h.free, member=h.bob)
    chunks = [m.content for m in sent_messages()]
    assert len(chunks) >= 3 and all(len(c) <= 2000 for c in chunks)
    assert all(c.count("```") % 2 == 0 for c in chunks)  # every chunk's blocks are closed
    assert all(c.startswith("```python\n") for c in chunks[1:])  # and reopened with the language
    printed = [line for c in chunks for line in c.splitlines() if line.startswith("print(")]
    assert printed == code.splitlines()
    assert chunks[-1].endswith("Run it with python.")


def test_split_reply_keeps_short_text_whole_and_cuts_a_long_line():
    assert split_reply("short") == ["short"]
    parts = split_reply("x" * 4500)
    assert "".join(parts) == "x" * 4500 and all(len(p) <= 2000 for p in parts)


async def test_every_sent_chunk_is_recorded_with_its_episode(start):
    h = await start(lambda msgs, kw: say("word " * 900))  # 4,500 characters: three chunks
    await dpytest.message("talk", channel=h.free, member=h.bob)
    sent = sent_messages()
    events = await h.rt.store.events("discord_reply")
    episode = (await h.rt.store.episodes_since(0))[0].id
    assert [e["payload"]["message_id"] for e in events] == [m.id for m in sent]
    assert {e["episode_id"] for e in events} == {episode}
    assert len(sent) == 3


async def test_attachments_are_saved_in_uploads_and_named_to_the_agent(start, tmp_path):
    h = await start(lambda msgs, kw: say("got it"))
    report = tmp_path / "report.txt"
    report.write_text("quarterly numbers\n")
    await dpytest.message(f"{h.me} read this", channel=h.general, member=h.bob,
                          attachments=[report])
    await dpytest.message(f"{h.me} and again", channel=h.general, member=h.bob,
                          attachments=[report])
    workspace = h.rt.spaces.context(str(h.general.id)).workspace
    assert (workspace.root / "uploads/report.txt").read_text() == "quarterly numbers\n"
    assert (workspace.root / "uploads/report-1.txt").read_text() == "quarterly numbers\n"
    assert h.prompts() == ["read this\n[attached: uploads/report.txt (18 B)]",
                           "and again\n[attached: uploads/report-1.txt (18 B)]"]


class FakeAttachment:
    def __init__(self, filename: str, data: bytes, size: int | None = None) -> None:
        self.filename, self._data = filename, data
        self.size = len(data) if size is None else size

    async def read(self) -> bytes:
        return self._data


async def test_attachment_names_are_sanitised_and_oversized_ones_are_refused(tmp_path):
    from sandbox.paths import workspace_for

    workspace = workspace_for(tmp_path / "ws", "c1")
    notes = await save_attachments([FakeAttachment("../../.ssh/id rsa.txt", b"key"),
                                    FakeAttachment("huge.bin", b"", size=9 * 1024 * 1024),
                                    FakeAttachment("liar.bin", b"x" * 2048)], workspace,
                                   max_bytes=1024)
    assert notes[0] == "[attached: uploads/id_rsa.txt (3 B)]"
    assert notes[1].startswith("[not saved: huge.bin (9.0 MB) is over the 1 KB limit")
    assert notes[2].startswith("[not saved: liar.bin")  # the reported size lied
    assert sorted(p.name for p in (workspace.root / "uploads").iterdir()) == ["id_rsa.txt"]
    assert safe_name("...") == "file" and safe_name("résumé 2.pdf") == "résumé_2.pdf"
    assert human_size(12 * 1024) == "12 KB"


async def test_files_the_agent_sends_are_uploaded_with_the_reply(start):
    def script(messages, kwargs):
        if messages[-1]["role"] == "user":
            return call("write_file", {"path": "out.txt", "content": "the result\n"})
        outbox = h.rt.spaces.context(str(h.free.id)).services["outbox"]
        outbox += ["out.txt", "missing.txt", "../etc/passwd"]
        return say("Here is the file.")

    h = await start(script)
    await dpytest.message("make me a file", channel=h.free, member=h.bob)
    [reply] = sent_messages()
    assert reply.content.startswith("Here is the file.")
    assert "(could not send missing.txt: no such file)" in reply.content
    assert "(could not send ../etc/passwd: refused" in reply.content
    assert [a.filename for a in reply.attachments] == ["out.txt"]
    assert (await reply.attachments[0].read()) == b"the result\n"


async def test_a_full_channel_queue_answers_with_the_busy_message(start):
    release = asyncio.Event()

    async def wait_then_answer():
        await release.wait()
        return say("done")

    class SlowLLM(ScriptedLLM):
        async def chat(self, messages, **kwargs):
            self.calls.append((messages, kwargs))
            return await wait_then_answer()

    h = await start([])
    h.rt.llm = h.rt.agent.llm = h.llm = SlowLLM([])
    h.rt.workers._queue_size = 1  # one waiting message fills the queue
    for text in ("first", "second", "third"):
        backend.make_message(text, h.bob, h.free)  # dispatch without waiting for the turn
        for _ in range(20):
            await asyncio.sleep(0)
    busy = sent_messages()
    assert len(busy) == 1 and "busy" in busy[0].content and "try again" in busy[0].content
    release.set()
    await dpytest.run_all_events()
    assert [m.content for m in sent_messages()] == ["done", "done"]


async def test_a_failed_turn_answers_a_short_error_and_the_bot_keeps_answering(start):
    replies = iter([RuntimeError("harness bug"), say("fine again")])

    def script(messages, kwargs):
        reply = next(replies)
        if isinstance(reply, Exception):
            raise reply
        return reply

    h = await start(script)
    await dpytest.message("break", channel=h.free, member=h.bob)
    await dpytest.message("again", channel=h.free, member=h.bob)
    assert [m.content for m in sent_messages()] == [TURN_FAILED, "fine again"]


# -- !sleep ----------------------------------------------------------------------------


async def test_sleep_command_from_an_admin_queues_a_night(start):
    h = await start([])
    await dpytest.message("!sleep", channel=h.general, member=h.alice)
    [reply] = sent_messages()
    assert reply.content.startswith("Night requested (job #1, queued)")
    [job] = await h.rt.store.jobs("sleep")
    assert job["state"] == "queued" and job["args"]["channel"] == str(h.general.id)
    assert str(h.alice.id) in job["args"]["requested_by"]
    assert h.llm.calls == []  # a command never reaches the agent


async def test_sleep_command_from_a_non_admin_is_refused_politely(start):
    h = await start([])
    await dpytest.message("!sleep", channel=h.free, member=h.bob)
    assert [m.content for m in sent_messages()] == [REFUSAL]
    assert await h.rt.store.jobs("sleep") == [] and h.llm.calls == []


# -- reactions -> labels ----------------------------------------------------------------


async def test_check_and_cross_reactions_label_the_replys_episode(start):
    h = await start(lambda msgs, kw: say("an answer"))
    await dpytest.message("q1", channel=h.free, member=h.bob)
    await dpytest.message("q2", channel=h.free, member=h.bob)
    first, second = sent_messages()
    e1, e2 = [e.id for e in await h.rt.store.episodes_since(0)]
    await dpytest.add_reaction(h.bob, first, CHECK)
    await dpytest.add_reaction(h.alice, second, CROSS)
    await dpytest.add_reaction(h.bob, second, "\N{THUMBS UP SIGN}")  # not a label
    assert await h.labels() == [(e1, "accepted", "reaction"), (e2, "rejected", "reaction")]


async def test_reactions_by_bots_blocked_users_or_on_other_messages_label_nothing(start):
    h = await start(lambda msgs, kw: say("an answer"))
    question = await dpytest.message("q", channel=h.free, member=h.bob)
    [answer] = sent_messages()
    robot = make_member("robot", h.general.guild, bot=True)
    await dpytest.add_reaction(robot, answer, CHECK)
    await dpytest.add_reaction(h.bot.user, answer, CHECK)
    await dpytest.add_reaction(h.alice, question, CHECK)  # the user's message, not a reply
    h.rt.config.discord.blocked_user_ids = [h.bob.id]
    await dpytest.add_reaction(h.bob, answer, CROSS)
    assert await h.labels() == []


async def test_a_reaction_after_a_restart_finds_the_episode_in_the_store(start):
    h = await start(lambda msgs, kw: say("an answer"))
    await dpytest.message("q", channel=h.free, member=h.bob)
    [answer] = sent_messages()
    [episode] = await h.rt.store.episodes_since(0)
    restarted = NightshiftBot(h.rt)  # as after a restart: an empty cache
    assert await restarted.replies.episode_of(answer.id) == episode.id
    assert await restarted.replies.episode_of(answer.id + 1) is None


# -- access policy (pure) ---------------------------------------------------------------


def test_the_access_policy_follows_allow_and_block_lists(tmp_path):
    config = make_config(tmp_path, admin_user_ids=[1], allowed_role_ids=[50],
                         blocked_channel_ids=[900], no_mention_channel_ids=[800])
    member = Origin(2, frozenset({50}), frozenset({700}), is_dm=False)
    assert is_allowed(config, member)
    assert not is_allowed(config, Origin(3, frozenset(), frozenset({700}), False))
    assert is_allowed(config, Origin(1, frozenset(), frozenset({700}), False))  # admin
    assert not is_allowed(config, Origin(1, frozenset(), frozenset({900, 1}), False))  # blocked
    thread = Origin(2, frozenset({50}), frozenset({12, 800}), False)  # a thread of #800
    assert needs_mention(config, member) and not needs_mention(config, thread)
    assert not needs_mention(config, Origin(2, frozenset(), frozenset({5}), is_dm=True))
    config.discord.allow_dms = False
    assert not is_allowed(config, Origin(2, frozenset(), frozenset({5}), is_dm=True))
    assert is_allowed(config, Origin(1, frozenset(), frozenset({5}), is_dm=True))


# -- admin commands: the plain functions --------------------------------------------------

ADMIN_CASES = {  # command -> (options, what the answer starts with)
    "status": ({}, "model: base (base.gguf)"),
    "sleep": ({}, "Night requested (job #1"),
    "wake": ({}, "No night is queued or running."),
    "promote": ({"release_id": None}, "No candidate release to promote."),
    "rollback": ({"release_id": 7}, "Release #7 is not a retired release."),
    "label": ({"episode_id": 1, "label": "verified"}, "Episode #1 labelled verified."),
    "sys show": ({}, "(this channel's editable system section is empty)"),
    "sys reset": ({}, "This channel's editable system section was reset"),
    "restart-server": ({}, "Model server restarted (pid 4243)."),
    "notes-clean": ({}, ""),
}


async def runtime_with_an_episode(tmp_path: Path) -> Runtime:
    config = make_config(tmp_path, admin_user_ids=[1], admin_role_ids=[77])
    rt = await Runtime.start(config, supervisor=FakeSupervisor(tmp_path / "base.gguf"),
                             llm=ScriptedLLM([say("hi")]), start_server=False)
    await rt.turn("c1", "hello")
    return rt


async def test_every_admin_action_runs_for_an_admin_user_or_role(tmp_path):
    assert set(ADMIN_CASES) == set(ACTIONS)
    rt = await runtime_with_an_episode(tmp_path)
    try:
        for name, (options, expected) in ADMIN_CASES.items():
            answer = await run_admin(rt, Caller(1, (), "c1", "alice (1)"), name, **options)
            assert not answer.refused and answer.text.startswith(expected), (name, answer)
        by_role = await run_admin(rt, Caller(5, (77,), "c1", "eve (5)"), "wake")
        assert not by_role.refused
        assert [tuple(r) for r in await rt.store._fetch("SELECT label, source FROM labels")] == [
            ("verified", "admin")]
    finally:
        await rt.close()


async def test_every_admin_action_is_refused_to_a_non_admin(tmp_path):
    rt = await runtime_with_an_episode(tmp_path)
    try:
        for name, (options, _) in ADMIN_CASES.items():
            answer = await run_admin(rt, Caller(2, (3,), "c1", "bob (2)"), name, **options)
            assert answer.refused and answer.text == REFUSAL
        assert await rt.store.jobs("sleep") == [] and rt.supervisor.restarts == 0
    finally:
        await rt.close()


async def test_an_admin_action_that_raises_answers_its_error(tmp_path):
    rt = await runtime_with_an_episode(tmp_path)

    async def broken(reason):
        raise RuntimeError("no GPU left")

    rt.supervisor.restart = broken
    try:
        answer = await run_admin(rt, Caller(1, (), "c1", "alice (1)"), "restart-server")
        assert answer.text == "restart-server failed: no GPU left"
    finally:
        await rt.close()


# -- admin commands: the slash wrappers ----------------------------------------------------

SLASH_CASES = [  # (path in the tree, callback kwargs, interaction options, expected start)
    (["status"], {}, [], "model: base (base.gguf)"),
    (["sleep"], {}, [], "Night requested (job #1"),
    (["wake"], {}, [], "No night is queued or running."),
    (["promote"], {}, [], "No candidate release to promote."),
    (["rollback"], {"release_id": 3}, [{"name": "release_id", "type": 4, "value": 3}],
     "Release #3 is not a retired release."),
    (["label"], {"episode_id": 99, "label": "accepted"},
     [{"name": "episode_id", "type": 4, "value": 99},
      {"name": "label", "type": 3, "value": "accepted"}], "Not labelled: no episode 99"),
    (["sys", "show"], {}, [], "(this channel's editable system section is empty)"),
    (["sys", "reset"], {}, [], "This channel's editable system section was reset"),
    (["restart-server"], {}, [], "Model server restarted"),
    (["notes-clean"], {}, [], ""),
]


def tree_command(bot: NightshiftBot, path: list[str]):
    command = bot.tree.get_command(path[0])
    for name in path[1:]:
        command = command.get_command(name)
    return command


@pytest.fixture
def recorder():
    recorder = InteractionRecorder()
    token = recorder.install()
    yield recorder
    recorder.uninstall(token)


async def test_every_admin_slash_command_is_registered_and_guild_only(start):
    h = await start([])
    commands = h.bot.tree.get_commands()
    assert {c.name for c in commands} == {"status", "sleep", "wake", "promote", "rollback",
                                          "label", "sys", "restart-server", "notes-clean"}
    assert all(c.guild_only for c in commands)
    assert {c.name for c in h.bot.tree.get_command("sys").commands} == {"show", "reset"}


@pytest.mark.parametrize("path,kwargs,options,expected", SLASH_CASES,
                         ids=[" ".join(c[0]) for c in SLASH_CASES])
async def test_admin_slash_command_answers_an_admin(start, recorder, path, kwargs, options,
                                                    expected):
    h = await start([])
    command = tree_command(h.bot, path)
    data_options = ([{"name": path[1], "type": 1, "options": options}] if len(path) > 1
                    else options)
    await command.callback(interaction(h.bot, h.alice, h.general, path[0], data_options),
                           **kwargs)
    assert [s.kind for s in recorder.sent] == ["deferred", "followup"]
    assert not any(s.ephemeral for s in recorder.sent)
    assert recorder.sent[1].content.startswith(expected)


@pytest.mark.parametrize("path,kwargs,options,expected", SLASH_CASES,
                         ids=[" ".join(c[0]) for c in SLASH_CASES])
async def test_admin_slash_command_refuses_a_non_admin_ephemerally(start, recorder, path,
                                                                   kwargs, options, expected):
    h = await start([])
    await tree_command(h.bot, path).callback(
        interaction(h.bot, h.bob, h.general, path[0], options), **kwargs)
    assert [(s.kind, s.content, s.flags) for s in recorder.sent] == [("message", REFUSAL, 64)]
    assert await h.rt.store.jobs("sleep") == [] and h.rt.supervisor.restarts == 0


async def test_an_admin_role_grants_the_slash_commands(start, recorder):
    h = await start([])
    night_shift = backend.make_role("night-shift", h.general.guild)
    carol = make_member("carol", h.general.guild, roles=[night_shift])
    h.rt.config.discord.admin_role_ids = [night_shift.id]
    await tree_command(h.bot, ["wake"]).callback(interaction(h.bot, carol, h.general, "wake"))
    assert [s.kind for s in recorder.sent] == ["deferred", "followup"]
    assert recorder.sent[1].content == "No night is queued or running."
