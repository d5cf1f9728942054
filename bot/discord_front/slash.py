"""Admin commands on Discord: the slash commands and ``!sleep``.

Each slash command is generated from the table in ``bot.commands``: a thin
wrapper that names the command and passes its options to ``run_command``
(the permission check, then the action), so the behaviour is tested without
Discord. Permission is
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
import inspect
import logging
from typing import TYPE_CHECKING, Literal, Optional

import discord
from discord import app_commands
from discord.ext import commands

from bot.commands import (
    COMMANDS,
    REFUSAL,
    Answer,
    Caller,
    Command,
    FilePath,
    permitted,
    run_command,
)
from bot.discord_front.access import caller_of, is_blocked, origin_of, role_ids
from bot.discord_front.render import answer_interaction, safe_name, send_reply

if TYPE_CHECKING:
    from bot.runtime import Runtime

logger = logging.getLogger("nightshift.discord")
__all__ = ["REFUSAL", "Answer", "add_admin_commands", "slash"]
ATTACHED = "_attachment"  # a FilePath argument's attached-file option is its name + this
MAX_ATTACHED_BYTES = 16 << 20


async def slash(rt: Runtime, interaction: discord.Interaction, name: str,
                **options: object) -> None:
    """The body of every admin slash command."""
    user = interaction.user
    # Keyed by id: the interaction's channel object may be a partial one.
    key = str(interaction.channel_id) if interaction.guild_id else f"dm-{user.id}"
    caller = Caller(user.id, role_ids(user), key, f"{user} ({user.id})")
    # The block lists hold for commands as for messages (roles looked up in the bot's
    # servers where the interaction carries none); an uncached channel is known by its id
    # alone, so a block by category needs the channel in the cache.
    where = interaction.channel or discord.Object(interaction.channel_id or 0)
    blocked = is_blocked(rt.config, origin_of(user, where, interaction.client.guilds))
    if blocked or not await permitted(rt, caller, name, **options):
        await answer_interaction(interaction, COMMANDS[name].refusal, ephemeral=True)
        return
    await interaction.response.defer(thinking=True)
    command = COMMANDS[name]
    try:
        options = await _attached(rt, command, interaction.id, options)
    except ValueError as exc:
        await answer_interaction(interaction, f"{name}: {exc}\nusage: {command.usage}")
        return
    answer = await run_command(rt, caller, name, **options)
    await answer_interaction(interaction, answer.text)


async def _attached(rt: Runtime, command: Command, interaction_id: int,
                    options: dict) -> dict:
    """A FilePath argument given as an attachment becomes the path it is saved at
    (under ``data/uploads``); after the permission check, so only admins' files land."""
    options = dict(options)
    for arg in command.args:
        if arg.type is not FilePath:
            continue
        attachment = options.pop(arg.name + ATTACHED, None)
        if attachment is not None:
            if attachment.size > MAX_ATTACHED_BYTES:
                raise ValueError(f"the attached {arg.name} is over {MAX_ATTACHED_BYTES} bytes")
            path = rt.config.data_dir / "uploads" / (
                f"{interaction_id}-{safe_name(attachment.filename)}")
            data = await attachment.read()
            await asyncio.to_thread(_save, path, data)
            options[arg.name] = str(path)
        elif options.get(arg.name) is None:
            options.pop(arg.name, None)
            if arg.required:
                raise ValueError(f"give {arg.name.upper()} as a path on the bot's machine, "
                                 "or attach the file")
    return options


def _save(path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def add_admin_commands(bot: commands.Bot, rt: Runtime) -> None:
    """Register ``!sleep`` and one slash command per entry of ``bot.commands.COMMANDS``."""

    @commands.command(name="sleep")
    async def sleep_prefix(ctx: commands.Context) -> None:
        """Start the night (admins only)."""
        answer = await run_command(rt, caller_of(ctx.author, ctx.channel), "sleep")
        await send_reply(ctx.message, answer.text)

    bot.add_command(sleep_prefix)
    groups: dict[str, app_commands.Group] = {}
    for command in COMMANDS.values():
        callback = _callback(rt, command)
        group_name, _, sub = command.name.rpartition(" ")
        if not group_name:
            bot.tree.command(name=command.name, description=_describe(command))(
                app_commands.guild_only()(callback))
            continue
        group = groups.get(group_name)
        if group is None:
            group = groups[group_name] = app_commands.Group(
                name=group_name, guild_only=True,
                description=f"/{group_name} commands (admins)")
            bot.tree.add_command(group)
        group.command(name=sub, description=_describe(command))(callback)


def _describe(command: Command) -> str:
    return f"{command.help[:1].upper()}{command.help[1:]} ({command.who})"[:100]


def _callback(rt: Runtime, command: Command):
    """A slash callback with one typed parameter per argument, as discord.py reads them."""

    async def callback(interaction: discord.Interaction, **options: object) -> None:
        await slash(rt, interaction, command.name, **options)

    params = [inspect.Parameter("interaction", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=discord.Interaction)]
    described = {}
    for arg in command.args:
        kind = Literal[arg.choices] if arg.choices else arg.type
        required = arg.required and arg.type is not FilePath  # or attached instead
        shown = str if kind is FilePath else kind
        params.append(inspect.Parameter(
            arg.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=shown if required else Optional[shown],
            default=inspect.Parameter.empty if required else None))
        described[arg.name] = arg.help
        if arg.type is FilePath:
            params.append(inspect.Parameter(
                arg.name + ATTACHED, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=Optional[discord.Attachment], default=None))
            described[arg.name + ATTACHED] = f"{arg.help} (attached instead of a path)"[:100]
    # Discord lists required options first.
    params[1:] = sorted(params[1:], key=lambda p: p.default is not inspect.Parameter.empty)
    callback.__signature__ = inspect.Signature(params)
    if command.args:
        callback = app_commands.describe(**described)(callback)
    return callback
