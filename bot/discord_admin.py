"""Admin commands on Discord: the slash commands and ``!sleep``.

Each command is a thin wrapper: it names an action and its arguments, and
``run_admin`` does the rest (the permission check, then the action from
``bot.admin``), so the behaviour is tested without Discord. Permission is
checked in code against the configured admin users and roles. The commands
carry no ``default_permissions``: that would hide them from configured
admins who lack the Discord permission, and any server admin can change it,
so it would guard nothing.

A non-admin gets an ephemeral refusal at once. An admin's command is
deferred first (promote, rollback and restart-server restart the model
server, which takes longer than Discord's three seconds), then answered
with followups.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import discord
from discord import app_commands
from discord.ext import commands

from bot import admin
from bot.discord_access import Caller, caller_of, role_ids
from bot.discord_render import answer_interaction, send_reply

if TYPE_CHECKING:
    from bot.runtime import Runtime

logger = logging.getLogger("nightshift.discord")
REFUSAL = "Sorry, only Nightshift's admins can use this command."
Label = Literal["accepted", "rejected", "verified"]

# Command name -> action. Each takes the runtime, the caller and the command's options.
ACTIONS: dict[str, Callable[..., Awaitable[str]]] = {
    "status": lambda rt, c: admin.status(rt),
    "sleep": lambda rt, c: admin.sleep(rt, c.name, c.channel),
    "wake": lambda rt, c: admin.wake(rt),
    "promote": lambda rt, c, release_id=None: admin.promote(rt, release_id),
    "rollback": lambda rt, c, release_id=None: admin.rollback(rt, release_id),
    "label": lambda rt, c, episode_id, label: admin.label(rt, episode_id, label, "admin"),
    "sys show": lambda rt, c: admin.sys_show(rt, c.channel),
    "sys reset": lambda rt, c: admin.sys_reset(rt, c.channel),
    "restart-server": lambda rt, c: admin.restart_server(rt),
    "notes-clean": lambda rt, c: admin.notes_clean(rt, c.channel),
}


@dataclass(frozen=True)
class Answer:
    text: str
    refused: bool = False


async def run_admin(rt: Runtime, caller: Caller, name: str, **options: object) -> Answer:
    """Check that ``caller`` is an admin, then run the action ``name``."""
    if not admin.is_admin(rt.config, caller.user_id, caller.role_ids):
        logger.info("refused %s to %s", name, caller.name)
        return Answer(REFUSAL, refused=True)
    logger.info("%s runs %s %s in #%s", caller.name, name, options or "", caller.channel)
    try:
        return Answer(await ACTIONS[name](rt, caller, **options))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # an admin sees why; the handler and the bot keep going
        logger.exception("admin command %s failed", name)
        return Answer(f"{name} failed: {exc}")


async def slash(rt: Runtime, interaction: discord.Interaction, name: str,
                **options: object) -> None:
    """The body of every admin slash command."""
    user = interaction.user
    # Keyed by id: the interaction's channel object may be a partial one.
    key = str(interaction.channel_id) if interaction.guild_id else f"dm-{user.id}"
    caller = Caller(user.id, role_ids(user), key, f"{user} ({user.id})")
    if not admin.is_admin(rt.config, caller.user_id, caller.role_ids):
        await answer_interaction(interaction, REFUSAL, ephemeral=True)
        return
    await interaction.response.defer(thinking=True)
    answer = await run_admin(rt, caller, name, **options)
    await answer_interaction(interaction, answer.text)


def add_admin_commands(bot: commands.Bot, rt: Runtime) -> None:
    """Register ``!sleep`` and the admin slash commands on ``bot``."""

    @commands.command(name="sleep")
    async def sleep_prefix(ctx: commands.Context) -> None:
        """Start the night (admins only)."""
        answer = await run_admin(rt, caller_of(ctx.author, ctx.channel), "sleep")
        await send_reply(ctx.message, answer.text)

    bot.add_command(sleep_prefix)
    _add_night_commands(bot.tree, rt)
    _add_model_commands(bot.tree, rt)
    _add_channel_commands(bot.tree, rt)


def _add_night_commands(tree: app_commands.CommandTree, rt: Runtime) -> None:
    @tree.command(name="status", description="Model, server, queues and the night (admins)")
    @app_commands.guild_only()
    async def status(interaction: discord.Interaction) -> None:
        await slash(rt, interaction, "status")

    @tree.command(name="sleep", description="Start the night: train on the day (admins)")
    @app_commands.guild_only()
    async def sleep(interaction: discord.Interaction) -> None:
        await slash(rt, interaction, "sleep")

    @tree.command(name="wake", description="Cancel a queued or running night (admins)")
    @app_commands.guild_only()
    async def wake(interaction: discord.Interaction) -> None:
        await slash(rt, interaction, "wake")

    @tree.command(name="label", description="Label an episode for the night (admins)")
    @app_commands.describe(episode_id="the episode's id", label="the label to give it")
    @app_commands.guild_only()
    async def label(interaction: discord.Interaction, episode_id: int, label: Label) -> None:
        await slash(rt, interaction, "label", episode_id=episode_id, label=label)


def _add_model_commands(tree: app_commands.CommandTree, rt: Runtime) -> None:
    @tree.command(name="promote", description="Serve a candidate release (admins)")
    @app_commands.describe(release_id="the release; the newest candidate if omitted")
    @app_commands.guild_only()
    async def promote(interaction: discord.Interaction, release_id: int | None = None) -> None:
        await slash(rt, interaction, "promote", release_id=release_id)

    @tree.command(name="rollback", description="Serve an earlier release again (admins)")
    @app_commands.describe(release_id="the release; the newest retired one if omitted")
    @app_commands.guild_only()
    async def rollback(interaction: discord.Interaction, release_id: int | None = None) -> None:
        await slash(rt, interaction, "rollback", release_id=release_id)

    @tree.command(name="restart-server", description="Restart the model server (admins)")
    @app_commands.guild_only()
    async def restart_server(interaction: discord.Interaction) -> None:
        await slash(rt, interaction, "restart-server")


def _add_channel_commands(tree: app_commands.CommandTree, rt: Runtime) -> None:
    sys_group = app_commands.Group(name="sys", guild_only=True,
                                   description="This channel's editable system section (admins)")

    @sys_group.command(name="show", description="Show this channel's system section (admins)")
    async def sys_show(interaction: discord.Interaction) -> None:
        await slash(rt, interaction, "sys show")

    @sys_group.command(name="reset", description="Reset this channel's system section (admins)")
    async def sys_reset(interaction: discord.Interaction) -> None:
        await slash(rt, interaction, "sys reset")

    tree.add_command(sys_group)

    @tree.command(name="notes-clean", description="Remove this channel's notes (admins)")
    @app_commands.guild_only()
    async def notes_clean(interaction: discord.Interaction) -> None:
        await slash(rt, interaction, "notes-clean")
