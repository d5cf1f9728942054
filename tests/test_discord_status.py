"""Discord progress: typing, plus a status message for a turn past ``discord.status_after_s``.

The model is scripted and slow (each call sleeps), the threshold tiny, so the
real runtime, agent and tools run a turn long enough to need a status message.
"""

from __future__ import annotations

import asyncio
import re

import discord.ext.test as dpytest
from discord.ext.test import callbacks

from tests.discord_helpers import discord_env_fixture, sent_messages  # noqa: F401 - fixture
from tests.scripted import ScriptedLLM, call, say


class SlowLLM(ScriptedLLM):
    def __init__(self, script, delay_s: float) -> None:
        super().__init__(script)
        self.delay_s = delay_s

    async def chat(self, messages, **kwargs):
        await asyncio.sleep(self.delay_s)
        return await super().chat(messages, **kwargs)


def record(monkeypatch):
    """Edits and deletes of the bot's messages, as (event, message id, new content);
    sends are read from dpytest's queue (its own callback fills it)."""
    seen = []

    async def edited(channel, message, fields):
        seen.append(("edit", message.id, fields["params"].payload.get("content")))

    async def deleted(channel, message, **kwargs):
        seen.append(("delete", message.id, None))

    monkeypatch.setitem(callbacks._callbacks, "edit_message", edited)
    monkeypatch.setitem(callbacks._callbacks, "delete_message", deleted)
    return seen


async def test_a_long_turn_gets_a_status_message_edited_per_step_then_deleted(
        discord_env, monkeypatch):
    llm = SlowLLM([call("list_dir", {"path": "."}), say("done")], delay_s=0.3)
    h = await discord_env(llm, status_after_s=0.1)
    seen = record(monkeypatch)
    await dpytest.message("work", channel=h.free, member=h.bob)
    status, reply = sent_messages()
    assert re.fullmatch("\N{HOURGLASS WITH FLOWING SAND} working \\(\\d+ s\\): step 1: thinking",
                        status.content), status.content
    assert reply.content == "done"
    edits = [content for event, id_, content in seen if event == "edit" and id_ == status.id]
    assert any(e.endswith("step 1: running list_dir") for e in edits), edits
    assert edits[-1].endswith("step 2: thinking")
    assert seen[-1] == ("delete", status.id, None)  # gone once the turn ended


async def test_a_quick_turn_sends_only_its_reply(discord_env, monkeypatch):
    h = await discord_env(SlowLLM([say("quick")], delay_s=0.0), status_after_s=5)
    seen = record(monkeypatch)
    await dpytest.message("hi", channel=h.free, member=h.bob)
    assert [m.content for m in sent_messages()] == ["quick"] and seen == []


async def test_status_after_zero_turns_the_status_off(discord_env, monkeypatch):
    h = await discord_env(SlowLLM([say("slow")], delay_s=0.2), status_after_s=0)
    seen = record(monkeypatch)
    await dpytest.message("hi", channel=h.free, member=h.bob)
    assert [m.content for m in sent_messages()] == ["slow"] and seen == []
