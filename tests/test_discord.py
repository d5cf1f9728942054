"""The Discord chat front end through dpytest: who it answers, replies, files, busy, labels.

Messages and reactions go through dpytest's fake gateway into the real
Runtime (store, channel workers, agent, tools) with a scripted model; see
tests/discord_helpers.py. Admin commands are in test_discord_admin.py.
"""

from __future__ import annotations

import asyncio

import discord
import discord.ext.test as dpytest
from discord.ext.test import backend, callbacks

from bot.discord_front.access import Origin, is_allowed, needs_mention
from bot.discord_front.app import TURN_FAILED, NightshiftBot
from bot.discord_front.render import safe_name, save_attachments, split_reply
from tests.discord_helpers import (
    discord_env_fixture,  # noqa: F401 - the fixture
    labels,
    make_config,
    make_member,
    react,
    sent_messages,
)
from tests.scripted import ScriptedLLM, call, say
from tools.sizes import human_size

CHECK, CROSS = "\N{WHITE HEAVY CHECK MARK}", "\N{CROSS MARK}"


def replying(text):
    return lambda messages, kwargs: say(text)


# -- where it answers ------------------------------------------------------------------


async def test_a_server_message_needs_a_mention_unless_its_channel_needs_none(discord_env):
    h = await discord_env(replying("hello"))
    await dpytest.message("anyone here?", channel=h.general, member=h.bob)
    assert sent_messages() == [] and h.llm.calls == []
    await dpytest.message(f"{h.me} anyone here?", channel=h.general, member=h.bob)
    await dpytest.message("and here?", channel=h.free, member=h.bob)
    assert [m.content for m in sent_messages()] == ["hello", "hello"]
    assert h.prompts() == ["anyone here?", "and here?"]  # the mention is stripped
    episodes = await h.rt.store.episodes_since(0)
    assert [e.channel_id for e in episodes] == [str(h.general.id), str(h.free.id)]


async def test_blocked_users_roles_and_channels_are_ignored_and_a_block_wins(discord_env):
    h = await discord_env(replying("ok"))
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


async def test_allow_lists_limit_channels_and_users_but_not_admins(discord_env):
    h = await discord_env(replying("ok"))
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


async def test_other_bots_and_the_bot_itself_are_ignored(discord_env):
    h = await discord_env(replying("ok"))
    robot = make_member("robot", h.general.guild, bot=True)
    await dpytest.message("hi", channel=h.free, member=robot)
    backend.make_message("hi", h.bot.user, h.free)  # the bot's own message
    await dpytest.run_all_events()
    assert sent_messages() == [] and h.llm.calls == []


async def test_a_direct_message_is_answered_in_a_channel_keyed_by_the_user(discord_env):
    h = await discord_env(replying("private hello"))
    h.rt.config.discord.allow_dms = True
    dm = await h.bob.create_dm()
    await dpytest.message("hi in private", channel=dm, member=h.bob)  # no mention needed
    assert [m.content for m in sent_messages()] == ["private hello"]
    assert [e.channel_id for e in await h.rt.store.episodes_since(0)] == [f"dm-{h.bob.id}"]
    h.rt.config.discord.allow_dms = False
    await dpytest.message("hi again", channel=dm, member=h.bob)
    assert sent_messages() == [] and len(h.llm.calls) == 1


def test_the_access_policy_follows_allow_and_block_lists(tmp_path):
    config = make_config(tmp_path, admin_user_ids=[1], allowed_role_ids=[50],
                         blocked_channel_ids=[900], no_mention_channel_ids=[800],
                         allow_dms=True)
    member = Origin(2, frozenset({50}), frozenset({700}), is_dm=False)
    assert is_allowed(config, member)
    assert not is_allowed(config, Origin(3, frozenset(), frozenset({700}), False))
    assert is_allowed(config, Origin(1, frozenset(), frozenset({700}), False))  # an admin
    assert not is_allowed(config, Origin(1, frozenset(), frozenset({900, 1}), False))  # blocked
    thread = Origin(2, frozenset({50}), frozenset({12, 800}), False)  # a thread in #800
    assert needs_mention(config, member) and not needs_mention(config, thread)
    assert not needs_mention(config, Origin(2, frozenset(), frozenset({5}), is_dm=True))
    assert is_allowed(config, Origin(2, frozenset({50}), frozenset({5}), is_dm=True))
    config.discord.allow_dms = False
    assert not is_allowed(config, Origin(2, frozenset(), frozenset({5}), is_dm=True))
    assert is_allowed(config, Origin(1, frozenset(), frozenset({5}), is_dm=True))


async def test_direct_messages_are_off_by_default(discord_env):
    h = await discord_env(replying("private hello"))
    dm = await h.bob.create_dm()
    await dpytest.message("hi in private", channel=dm, member=h.bob)
    assert sent_messages() == [] and h.llm.calls == []


async def test_direct_messages_follow_the_allowed_roles_and_channels(discord_env):
    """A stranger without the role gets no answer in a DM either (issue 11, part 2)."""
    h = await discord_env(replying("private hello"))
    d = h.rt.config.discord
    d.allow_dms = True
    helpers = backend.make_role("helpers", h.general.guild)
    dave = make_member("dave", h.general.guild, roles=[helpers])
    d.allowed_role_ids = [helpers.id]
    await dpytest.message("hi", channel=await h.bob.create_dm(), member=h.bob)  # no role
    assert sent_messages() == [] and h.llm.calls == []
    await dpytest.message("hi", channel=await dave.create_dm(), member=dave)  # has it
    assert [m.content for m in sent_messages()] == ["private hello"]
    d.allowed_role_ids, d.allowed_channel_ids = [], [h.general.id]
    await dpytest.message("hi", channel=await dave.create_dm(), member=dave)  # not a channel
    assert sent_messages() == [] and len(h.llm.calls) == 1
    await dpytest.message("hi", channel=await h.alice.create_dm(), member=h.alice)  # an admin
    assert [m.content for m in sent_messages()] == ["private hello"]


async def test_a_dm_authors_roles_are_fetched_when_not_cached():
    from types import SimpleNamespace

    from bot.discord_front.app import fetch_role_ids

    class Guild:
        def __init__(self, members):
            self.members = members

        async def fetch_member(self, user_id):
            if user_id not in self.members:
                raise discord.NotFound(SimpleNamespace(status=404, reason="x"), "no member")
            return SimpleNamespace(roles=[SimpleNamespace(id=r) for r in self.members[user_id]])

    guilds = [Guild({2: [50]}), Guild({2: [60], 3: [70]})]
    assert await fetch_role_ids(2, guilds) == {50, 60}
    assert await fetch_role_ids(4, guilds) == set()


def test_a_dm_authors_roles_come_from_the_servers_the_bot_shares(tmp_path):
    from types import SimpleNamespace

    from bot.discord_front.access import origin_of

    member = SimpleNamespace(roles=[SimpleNamespace(id=50)])
    guilds = [SimpleNamespace(get_member=lambda uid: member if uid == 2 else None)]
    user = SimpleNamespace(id=2)  # a DM's author is a plain User: no roles of its own
    origin = origin_of(user, SimpleNamespace(id=5, guild=None), guilds)
    assert origin.is_dm and origin.role_ids == {50}
    assert origin_of(SimpleNamespace(id=3), SimpleNamespace(id=5, guild=None), guilds).role_ids == set()


# -- replies ---------------------------------------------------------------------------


async def test_typing_shows_while_the_agent_works(discord_env, monkeypatch):
    typing_in = []

    async def record_typing(channel):
        typing_in.append(channel.id)

    monkeypatch.setitem(callbacks._callbacks, "send_typing", record_typing)

    def script(messages, kwargs):
        assert typing_in == [h.free.id]  # already typing when the model is asked
        return say("done")

    h = await discord_env(script)
    await dpytest.message("work", channel=h.free, member=h.bob)
    assert [m.content for m in sent_messages()] == ["done"]


async def test_a_long_reply_is_split_without_breaking_its_code_block(discord_env, monkeypatch):
    references = []
    send = discord.abc.Messageable.send

    async def spy(self, content=None, **kwargs):
        references.append(kwargs.get("reference"))
        return await send(self, content, **kwargs)

    monkeypatch.setattr(discord.abc.Messageable, "send", spy)
    code = "\n".join(f"print({i})  # a line of code that takes some room" for i in range(120))
    h = await discord_env(replying(f"Here is the script:\n```python\n{code}\n```\nRun it."))
    question = await dpytest.message("write a script", channel=h.free, member=h.bob)
    chunks = [m.content for m in sent_messages()]
    assert len(chunks) == 4 and all(len(c) <= 2000 for c in chunks)
    assert all(c.count("```") % 2 == 0 for c in chunks)  # each chunk's block is closed
    assert all(c.startswith("```python\n") for c in chunks[1:-1])  # and reopened, with language
    printed = [line for c in chunks for line in c.splitlines() if line.startswith("print(")]
    assert printed == code.splitlines() and chunks[-1] == "Run it."
    assert references[0].message_id == question.id  # the first chunk replies to the user
    assert references[1:] == [None] * 3


def test_split_reply_keeps_short_text_whole_and_cuts_a_long_line():
    assert split_reply("short") == ["short"]
    parts = split_reply("x" * 4500)
    assert "".join(parts) == "x" * 4500 and all(len(p) <= 2000 for p in parts)


async def test_every_sent_chunk_is_recorded_with_its_episode(discord_env):
    h = await discord_env(replying("word " * 900))  # 4,500 characters: three chunks
    await dpytest.message("talk", channel=h.free, member=h.bob)
    sent = sent_messages()
    events = await h.rt.store.events("discord_reply")
    [episode] = await h.rt.store.episodes_since(0)
    assert len(sent) == 3
    assert [e["payload"]["message_id"] for e in events] == [m.id for m in sent]
    assert {e["episode_id"] for e in events} == {episode.id}


async def test_a_failed_turn_answers_a_short_error_and_the_bot_keeps_answering(discord_env):
    replies = iter([RuntimeError("harness bug"), say("fine again")])

    def script(messages, kwargs):
        reply = next(replies)
        if isinstance(reply, Exception):
            raise reply
        return reply

    h = await discord_env(script)
    await dpytest.message("break", channel=h.free, member=h.bob)
    await dpytest.message("again", channel=h.free, member=h.bob)
    assert [m.content for m in sent_messages()] == [TURN_FAILED, "fine again"]


class GatedLLM(ScriptedLLM):
    """Answers "done" once ``gate`` is set, so turns pile up in the queue."""

    def __init__(self) -> None:
        super().__init__([])
        self.gate = asyncio.Event()

    async def chat(self, messages, **kwargs):
        self.calls.append((messages, kwargs))
        await self.gate.wait()
        return say("done")


async def test_a_full_channel_queue_answers_with_the_busy_message(discord_env):
    llm = GatedLLM()
    h = await discord_env(llm, queue_size=1)
    for text in ("first", "second", "third"):  # one runs, one waits, one is too many
        backend.make_message(text, h.bob, h.free)  # dispatched without awaiting the turn
        for _ in range(20):
            await asyncio.sleep(0)
    [busy] = sent_messages()
    assert busy.content.startswith(f"#{h.free.id} is busy") and "try again" in busy.content
    llm.gate.set()
    await dpytest.run_all_events()
    assert [m.content for m in sent_messages()] == ["done", "done"]
    assert h.prompts() == ["first", "second"]


# -- files -----------------------------------------------------------------------------


async def test_attachments_are_saved_in_uploads_and_named_to_the_agent(discord_env, tmp_path):
    h = await discord_env(replying("got it"))
    report = tmp_path / "report.txt"
    report.write_text("quarterly numbers\n")
    for text in ("read this", "and again"):
        await dpytest.message(f"{h.me} {text}", channel=h.general, member=h.bob,
                              attachments=[str(report)])
    uploads = h.rt.spaces.context(str(h.general.id)).workspace.root / "uploads"
    assert (uploads / "report.txt").read_text() == "quarterly numbers\n"
    assert (uploads / "report-1.txt").read_text() == "quarterly numbers\n"  # never overwritten
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
    assert notes[1].startswith("[not saved: huge.bin (9.0 MiB) is over the 1.0 KiB limit")
    assert notes[2].startswith("[not saved: liar.bin")  # its announced size lied
    assert sorted(p.name for p in (workspace.root / "uploads").iterdir()) == ["id_rsa.txt"]
    assert safe_name("...") == "file" and safe_name("résumé 2.pdf") == "résumé_2.pdf"
    assert human_size(12 * 1024) == "12.0 KiB" and human_size(3 * 2**30) == "3.0 GiB"


async def test_files_the_agent_sends_are_uploaded_after_the_reply(discord_env):
    def script(messages, kwargs):
        if messages[-1]["role"] == "user":
            return call("write_file", {"path": "out.txt", "content": "the result\n"})
        outbox = h.rt.spaces.context(str(h.free.id)).services.outbox
        outbox += ["out.txt", "missing.txt", "../etc/passwd"]  # what send_file would do
        return say("Here is the file.")

    h = await discord_env(script)
    await dpytest.message("make me a file", channel=h.free, member=h.bob)
    reply, upload = sent_messages()
    assert reply.content.startswith("Here is the file.")
    assert "(could not send missing.txt: no such file)" in reply.content
    assert "(could not send ../etc/passwd: refused" in reply.content
    assert [a.filename for a in upload.attachments] == ["out.txt"]
    assert await upload.attachments[0].read() == b"the result\n"
    events = await h.rt.store.events("discord_reply")
    assert [e["payload"]["message_id"] for e in events] == [reply.id, upload.id]


# -- reactions -> labels ----------------------------------------------------------------


async def test_check_and_cross_reactions_label_the_replys_episode(discord_env):
    h = await discord_env(replying("an answer"))
    await dpytest.message("q1", channel=h.free, member=h.bob)
    await dpytest.message("q2", channel=h.free, member=h.bob)
    first, second = sent_messages()
    e1, e2 = [e.id for e in await h.rt.store.episodes_since(0)]
    await react(h.bob, first, CHECK)
    await react(h.alice, second, CROSS)
    await react(h.bob, second, "\N{THUMBS UP SIGN}")  # not a label
    assert labels(h.rt.config) == [(e1, "accepted", "reaction"), (e2, "rejected", "reaction")]


async def test_reactions_by_bots_blocked_users_or_on_other_messages_label_nothing(discord_env):
    h = await discord_env(replying("an answer"))
    question = await dpytest.message("q", channel=h.free, member=h.bob)
    [answer] = sent_messages()
    await react(make_member("robot", h.general.guild, bot=True), answer, CHECK)
    await react(h.bot.user, answer, CHECK)
    await react(h.alice, question, CHECK)  # the user's own message is not a reply
    h.rt.config.discord.blocked_user_ids = [h.bob.id]
    await react(h.bob, answer, CROSS)
    assert labels(h.rt.config) == []


async def test_a_reaction_in_an_uncached_channel_is_looked_up_or_ignored_under_blocks(
        discord_env, monkeypatch):
    """Its channel id alone lost the parent and category: a category's block list missed
    it (issue 40). Now Discord is asked; when it cannot say, a configured block list wins."""
    h = await discord_env(replying("an answer"))
    await dpytest.message("q", channel=h.free, member=h.bob)
    [answer] = sent_messages()
    free = h.free
    asked = []

    async def fetch(channel_id):
        asked.append(channel_id)
        if h.rt.config.discord.blocked_channel_ids:
            raise discord.NotFound(type("R", (), {"status": 404, "reason": "gone"})(), "gone")
        return free

    monkeypatch.setattr(h.bot, "get_channel", lambda channel_id: None)
    monkeypatch.setattr(h.bot, "fetch_channel", fetch)
    h.rt.config.discord.blocked_channel_ids = [123456789]  # some category, maybe this one's
    await react(h.bob, answer, CROSS)
    assert labels(h.rt.config) == [] and asked == [free.id]
    h.rt.config.discord.blocked_channel_ids = []
    await react(h.bob, answer, CHECK)
    [(_, label, _)] = labels(h.rt.config)
    assert label == "accepted" and asked == [free.id, free.id]


async def test_a_reaction_after_a_restart_finds_the_episode_in_the_store(discord_env):
    h = await discord_env(replying("an answer"))
    await dpytest.message("q", channel=h.free, member=h.bob)
    [answer] = sent_messages()
    [episode] = await h.rt.store.episodes_since(0)
    restarted = NightshiftBot(h.rt)  # as after a restart: its cache is empty
    assert await restarted.replies.episode_of(answer.id) == episode.id
    assert await restarted.replies.episode_of(answer.id + 1) is None


async def test_attachments_count_against_the_workspace_quota(tmp_path):
    """Five messages put 400 MiB into a 10 MiB workspace (issue 40): now each attachment
    is refused once it would fill the workspace past its quota, and nothing is lost."""
    from sandbox.paths import workspace_for

    workspace = workspace_for(tmp_path / "ws", "c1")
    (workspace.root / "big.bin").write_bytes(b"x" * 40_000)
    notes = await save_attachments([FakeAttachment("a.txt", b"a" * 10_000),
                                    FakeAttachment("b.txt", b"b" * 30_000),
                                    FakeAttachment("c.txt", b"c" * 30_000, size=10)],
                                   workspace, quota_bytes=64 * 1024)
    assert notes[0] == "[attached: uploads/a.txt (9.8 KiB)]"
    assert notes[1].startswith("[not saved: b.txt (the workspace holds")
    assert notes[1].endswith("of its 64.0 KiB quota; delete files first)]")
    assert notes[2] == "[not saved: c.txt (it would fill the workspace past its 64.0 KiB quota)]"
    assert sorted(p.name for p in (workspace.root / "uploads").iterdir()) == ["a.txt"]
