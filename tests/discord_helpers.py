"""Fixtures and fakes for the Discord tests.

``discord_env`` starts the real Runtime (store, channel workers, agent, tools)
with a scripted model and a fake server supervisor, and the bot on dpytest's
fake gateway: a guild with #general (needs a mention) and #free (needs none),
alice (an admin) and bob. dpytest drives messages, prefix commands and
reactions; ``react`` adds a reaction as the gateway reports one (dpytest
0.7's own payload lacks a field discord.py 2.7 reads).

dpytest does not drive slash commands. ``InteractionRecorder.interaction``
builds a real ``discord.Interaction`` on dpytest's state, and the recorder
stands in for discord.py's webhook adapter, through which interaction
responses and followups go, recording what the bot answered.

Test modules import the fixture functions (``discord_env_fixture``,
``recorder_fixture``); the tests take them as ``discord_env`` and ``recorder``.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import discord
import discord.ext.test as dpytest
import pytest
from discord.ext.test import backend, factories
from discord.webhook import async_ as webhook_async

from bot.discord_front.app import NightshiftBot
from bot.runtime import Runtime
from core.config import Config
from tests.scripted import ScriptedLLM

_ids = itertools.count(900_000_000_000_000_001)
RESPONSE_TYPES = {4: "message", 5: "deferred"}
# dpytest makes its members through the member cache, which needs the members intent.
TEST_INTENTS = discord.Intents.default() | discord.Intents(members=True, message_content=True)


class FakeSupervisor:
    """What the runtime and the admin actions read of a model server supervisor."""

    def __init__(self, gguf: Path) -> None:
        self.ready = True
        self.base_url = "http://127.0.0.1:1/v1"
        self.pid = 4242
        self.restarts = 0
        self.last_restart_reason = ""
        self.gguf = gguf

    async def restart(self, reason: str) -> None:
        self.restarts += 1
        self.pid += 1
        self.last_restart_reason = reason

    async def stop(self) -> None:
        self.ready = False


def make_config(tmp_path: Path, **discord_fields: object) -> Config:
    config = Config()
    config.paths.data_dir = tmp_path / "data"
    config.agent.tools = "all"  # the front ends are under test, with every tool they may use
    for name, value in discord_fields.items():
        setattr(config.discord, name, value)
    return config


async def start_runtime(config: Config, llm: ScriptedLLM) -> Runtime:
    rt = await Runtime.start(config, supervisor=FakeSupervisor(config.data_dir / "base.gguf"),
                             llm=llm, start_server=False)
    # The front end is under test, not the trainer: record the launch instead of running it.
    rt.night.launched = []

    async def launch(job_id: int) -> None:
        rt.night.launched.append(job_id)

    rt.night.launch = launch
    return rt


def labels(config: Config) -> list[tuple[int, str, str]]:
    """(episode, label, source) rows, read from the store's file."""
    with sqlite3.connect(config.store_path) as db:
        return db.execute("SELECT episode_id, label, source FROM labels ORDER BY id").fetchall()


# -- the bot on dpytest -----------------------------------------------------------


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
        """The user message of each model call: what the agent received."""
        return [next(m["content"] for m in reversed(msgs) if m["role"] == "user")
                for msgs, _ in self.llm.calls]


@pytest.fixture(name="discord_env")
async def discord_env_fixture(tmp_path, monkeypatch):
    """``await discord_env(script_or_llm, queue_size=..., **discord_fields)`` -> Harness."""
    monkeypatch.chdir(tmp_path)  # dpytest writes the files the bot sends to ./dpytest_N.dat
    runtimes: list[Runtime] = []

    async def start(script, *, queue_size: int = 16, **discord_fields) -> Harness:
        config = make_config(tmp_path, **discord_fields)
        config.agent.queue_size = queue_size
        llm = script if isinstance(script, ScriptedLLM) else ScriptedLLM(script)
        rt = await start_runtime(config, llm)
        runtimes.append(rt)
        bot = NightshiftBot(rt, intents=TEST_INTENTS)
        await bot._async_setup_hook()
        dpytest.configure(bot, text_channels=["general", "free"], voice_channels=0,
                          members=["alice", "bob"])
        # dpytest's new state starts without a loop; typing() needs one.
        bot._connection.loop = asyncio.get_running_loop()
        cfg = dpytest.get_config()
        general, free = cfg.channels
        alice, bob = cfg.members
        config.discord.no_mention_channel_ids = [free.id]
        config.discord.admin_user_ids = [alice.id]
        return Harness(rt, bot, llm, general, free, alice, bob)

    yield start
    await dpytest.empty_queue()
    for rt in runtimes:  # the bot is not closed: dpytest's fake gateway cannot close
        await rt.close()


def sent_messages() -> list[discord.Message]:
    """What the bot sent since the last call, oldest first."""
    out = []
    while not dpytest.sent_queue.empty():
        out.append(dpytest.get_message())
    return out


def make_member(name: str, guild: discord.Guild, *, bot: bool = False,
                roles: list[discord.Role] | None = None) -> discord.Member:
    user = backend.get_state().store_user(
        factories.make_user_dict(name, "0042", None, factories.make_id(), bot=bot))
    return backend.make_member(user, guild, roles=roles)


def member_payload(member: discord.Member) -> dict:
    roles = [str(role.id) for role in member.roles if role != member.guild.default_role]
    return {"user": {"id": str(member.id), "username": member.name,
                     "discriminator": member.discriminator, "avatar": None, "bot": member.bot},
            "roles": roles, "joined_at": "2024-01-01T00:00:00+00:00",
            "deaf": False, "mute": False, "permissions": "0", "flags": 0}


async def react(user: discord.abc.User, message: discord.Message, emoji: str) -> None:
    """Add a reaction as Discord's gateway reports it, and let the handlers run."""
    data = {"message_id": message.id, "channel_id": message.channel.id, "user_id": user.id,
            "emoji": {"id": None, "name": emoji}, "type": 0, "burst": False}
    if message.guild is not None:
        data["guild_id"] = message.guild.id
    if isinstance(user, discord.Member):
        data["member"] = member_payload(user)
    backend.get_state().parse_message_reaction_add(data)
    await dpytest.run_all_events()


# -- slash commands --------------------------------------------------------------------


@dataclass
class Sent:
    """One answer to an interaction: its kind, content and flags (64 = ephemeral)."""

    kind: str  # "message" (a direct response), "deferred" or "followup"
    content: str | None
    flags: int = 0

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & 64)


@dataclass
class InteractionRecorder:
    """Replaces discord.py's webhook adapter; makes interactions and records the answers."""

    sent: list[Sent] = field(default_factory=list)
    channel: discord.abc.GuildChannel | None = None
    bot_user: discord.ClientUser | None = None

    async def create_interaction_response(self, interaction_id, token, **kwargs) -> dict:
        payload = kwargs["params"].payload or {}
        data = payload.get("data") or {}
        self.sent.append(Sent(RESPONSE_TYPES.get(payload.get("type"), str(payload.get("type"))),
                              data.get("content"), data.get("flags", 0)))
        return {"interaction": {"id": str(interaction_id), "type": 2}}

    async def execute_webhook(self, webhook_id, token, **kwargs) -> dict:
        """A followup; interaction webhooks always wait for the created message."""
        payload = kwargs.get("payload") or {}
        self.sent.append(Sent("followup", payload.get("content"), payload.get("flags", 0)))
        return factories.make_message_dict(self.channel, self.bot_user,
                                           content=payload.get("content"))

    def interaction(self, bot: discord.Client, member: discord.Member,
                    channel: discord.abc.GuildChannel, name: str,
                    options: list[dict] | None = None) -> discord.Interaction:
        """A slash-command interaction from ``member`` in ``channel`` on dpytest's state."""
        self.channel, self.bot_user = channel, bot.user
        payload = {
            "id": str(next(_ids)), "application_id": str(bot.user.id), "type": 2,
            "token": "interaction-token", "version": 1,
            "channel_id": str(channel.id), "guild_id": str(member.guild.id),
            "channel": {"id": str(channel.id), "type": 0},
            "member": member_payload(member),
            "data": {"id": str(next(_ids)), "name": name, "type": 1, "options": options or []},
            "locale": "en-US", "guild_locale": "en-US", "app_permissions": "0",
            "entitlements": [], "authorizing_integration_owners": {}, "context": 0,
            "attachment_size_limit": 8 * 1024 * 1024,
        }
        return discord.Interaction(data=payload, state=bot._connection)


@pytest.fixture(name="recorder")
def recorder_fixture():
    """Interaction answers go to this recorder for the test's duration."""
    recorder = InteractionRecorder()
    token = webhook_async.async_context.set(recorder)
    yield recorder
    webhook_async.async_context.reset(token)
