"""Labelling rights through dpytest: who may label or forget an episode, and taking it back.

Reactions go through dpytest's fake gateway into the real Runtime and store
(tests/discord_helpers.py); ``/forget`` runs through the command table as the
console and Discord run it.
"""

from __future__ import annotations

import sqlite3

import discord.ext.test as dpytest
from discord.ext.test import backend

from bot.commands import Caller, run_command
from bot.labelling import episode_author
from tests.discord_helpers import (
    discord_env_fixture,  # noqa: F401 - the fixture
    labels,
    react,
    sent_messages,
)
from tests.scripted import say
from trainer.collect import collect
from trainer.secrets import SecretScanner

CHECK, CROSS, BIN = "\N{WHITE HEAVY CHECK MARK}", "\N{CROSS MARK}", "\N{WASTEBASKET}"


def replying(text):
    return lambda messages, kwargs: say(text)


async def unreact(user, message, emoji: str) -> None:
    """Remove a reaction as Discord's gateway reports it: no member, so no roles."""
    data = {"message_id": message.id, "channel_id": message.channel.id, "user_id": user.id,
            "emoji": {"id": None, "name": emoji}, "type": 0, "burst": False,
            "guild_id": message.guild.id}
    backend.get_state().parse_message_reaction_remove(data)
    await dpytest.run_all_events()


async def asked_by(h, member, text="q"):
    """``member`` asks in #free; (the bot's reply, the episode's id)."""
    await dpytest.message(text, channel=h.free, member=member)
    [reply] = sent_messages()
    episodes = await h.rt.store.episodes_since(0)
    return reply, episodes[-1].id


async def test_only_the_author_or_an_admin_may_label_an_episode(discord_env):
    h = await discord_env(replying("an answer"))
    carol = backend.make_member(backend.make_user("carol", "0003"), h.free.guild)
    reply, episode = await asked_by(h, h.bob)
    assert await episode_author(h.rt.store, episode) == h.bob.id
    await react(carol, reply, CHECK)  # neither the author nor an admin: ignored
    assert labels(h.rt.config) == []
    await react(h.bob, reply, CHECK)  # the author
    await react(h.alice, reply, CROSS)  # an admin
    assert labels(h.rt.config) == [(episode, "accepted", "reaction"),
                                   (episode, "rejected", "reaction")]


async def test_the_latest_label_wins_and_removing_a_reaction_removes_its_label(discord_env):
    h = await discord_env(replying("an answer"))
    reply, episode = await asked_by(h, h.bob)
    await react(h.bob, reply, CHECK)
    await react(h.bob, reply, CROSS)
    [stored] = await h.rt.store.episodes_since(0)
    assert stored.labels == ["accepted", "rejected"] and stored.label == "rejected"
    await unreact(h.bob, reply, CROSS)  # back to the ✅ that still stands
    [stored] = await h.rt.store.episodes_since(0)
    assert stored.label == "accepted"
    await unreact(h.alice, reply, CHECK)  # alice's removal cannot take back bob's label
    assert labels(h.rt.config) == [(episode, "accepted", "reaction")]
    await unreact(h.bob, reply, CHECK)
    [stored] = await h.rt.store.episodes_since(0)
    assert stored.labels == [] and stored.label is None


def step_texts(config, episode: int) -> list[tuple]:
    with sqlite3.connect(config.store_path) as db:
        return db.execute("SELECT content, tool_calls, meta FROM steps WHERE episode_id = ?",
                          (episode,)).fetchall()


async def test_a_wastebasket_by_the_author_forgets_and_erases_the_episode(discord_env):
    h = await discord_env(replying("the secret plan is 42"))
    reply, episode = await asked_by(h, h.bob, "tell me the plan")
    carol = backend.make_member(backend.make_user("carol", "0003"), h.free.guild)
    await react(carol, reply, BIN)  # not hers: nothing happens
    assert not await h.rt.store.is_forgotten(episode)
    assert any("42" in (content or "") for content, _, _ in step_texts(h.rt.config, episode))
    await react(h.bob, reply, BIN)
    assert await h.rt.store.is_forgotten(episode)
    assert all(content == "" and calls is None and meta is None
               for content, calls, meta in step_texts(h.rt.config, episode))
    # Erased from what the agent is shown next, too: the next turn's context lacks it.
    h.llm.calls.clear()
    await dpytest.message("again", channel=h.free, member=h.bob)
    sent_messages()
    context = h.llm.calls[0][0]
    assert [m["content"] for m in context if m["role"] != "system"] == ["again"]


async def test_forget_command_is_for_the_author_or_an_admin(discord_env):
    h = await discord_env(replying("an answer"))
    _, episode = await asked_by(h, h.bob)
    channel = str(h.free.id)
    carol = Caller(12345, (), channel, "carol")
    answer = await run_command(h.rt, carol, "forget", episode_id=episode)
    assert answer.refused and "only the person whose message started" in answer.text
    assert not await h.rt.store.is_forgotten(episode)
    bob = Caller(h.bob.id, (), channel, "bob")
    answer = await run_command(h.rt, bob, "forget", episode_id=episode)
    assert not answer.refused and answer.text.startswith(f"Episode #{episode} is forgotten")
    assert await h.rt.store.is_forgotten(episode)
    again = await run_command(h.rt, Caller(h.alice.id, (), channel, "alice"), "forget",
                              episode_id=episode)
    assert again.text == f"Episode #{episode} was already forgotten."
    missing = await run_command(h.rt, Caller(h.alice.id, (), channel, "alice"), "forget",
                                episode_id=999)
    assert "no episode 999" in missing.text and "usage: /forget EPISODE_ID" in missing.text


async def test_a_forgotten_episode_is_not_collected_for_training(discord_env):
    h = await discord_env(replying("an answer"))
    _, first = await asked_by(h, h.bob, "one")
    _, second = await asked_by(h, h.bob, "two")
    await run_command(h.rt, Caller(0, (), "x", "console", local=True), "forget",
                      episode_id=first)
    collection = await collect(h.rt.store, SecretScanner([]), 0, since=0)
    assert [e.id for e in collection.episodes] == [second]
    assert collection.excluded["forgotten"] == 1
