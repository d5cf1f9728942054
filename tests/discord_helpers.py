"""Fakes for the Discord tests: a model server supervisor, slash-command interactions.

dpytest drives messages, prefix commands and reactions, but not app-command
interactions. For those, ``interaction`` builds a real ``discord.Interaction``
on dpytest's state, and ``InteractionRecorder`` stands in for discord.py's
webhook adapter (through which interaction responses and followups go) and
records what the bot answered.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import discord
from discord.webhook import async_ as webhook_async

from bot.config import Config

_ids = itertools.count(900_000_000_000_000_001)
RESPONSE_TYPES = {4: "message", 5: "deferred"}


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
    for name, value in discord_fields.items():
        setattr(config.discord, name, value)
    return config


@dataclass
class Sent:
    """One thing the bot sent through an interaction: its kind, content and flags."""

    kind: str
    content: str | None
    flags: int = 0

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & 64)


@dataclass
class InteractionRecorder:
    """Replaces discord.py's webhook adapter; records responses and followups."""

    sent: list[Sent] = field(default_factory=list)

    async def create_interaction_response(self, interaction_id, token, **kwargs) -> dict:
        payload = kwargs["params"].payload or {}
        data = payload.get("data") or {}
        self.sent.append(Sent(RESPONSE_TYPES.get(payload.get("type"), str(payload.get("type"))),
                              data.get("content"), data.get("flags", 0)))
        return {"interaction": {"id": str(interaction_id), "type": 2}}

    async def execute_webhook(self, webhook_id, token, **kwargs) -> None:
        payload = kwargs["params"].payload or {}
        self.sent.append(Sent("followup", payload.get("content"), payload.get("flags", 0)))

    @property
    def texts(self) -> str:
        return "\n".join(s.content for s in self.sent if s.content)

    def install(self) -> object:
        return webhook_async.async_context.set(self)

    @staticmethod
    def uninstall(token: object) -> None:
        webhook_async.async_context.reset(token)


def interaction(bot: discord.Client, member: discord.Member, channel: discord.abc.GuildChannel,
                name: str, options: list[dict] | None = None) -> discord.Interaction:
    """A slash-command interaction from ``member`` in ``channel`` for dpytest's state."""
    roles = [role.id for role in member.roles if role != member.guild.default_role]
    payload = {
        "id": str(next(_ids)), "application_id": str(bot.user.id), "type": 2,
        "token": "interaction-token", "version": 1,
        "channel_id": str(channel.id), "guild_id": str(member.guild.id),
        "channel": {"id": str(channel.id), "type": 0},
        "member": {"user": {"id": str(member.id), "username": member.name,
                            "discriminator": member.discriminator, "avatar": None},
                   "roles": [str(r) for r in roles], "joined_at": "2024-01-01T00:00:00+00:00",
                   "deaf": False, "mute": False, "permissions": "0", "flags": 0},
        "data": {"id": str(next(_ids)), "name": name, "type": 1, "options": options or []},
        "locale": "en-US", "guild_locale": "en-US", "app_permissions": "0",
        "entitlements": [], "authorizing_integration_owners": {}, "context": 0,
        "attachment_size_limit": 8 * 1024 * 1024,
    }
    return discord.Interaction(data=payload, state=bot._connection)
