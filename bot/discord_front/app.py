"""The Discord front end (discord.py 2.7): chat, ``!sleep``, admin slash commands, labels.

Each Discord channel is one agent channel (key: the channel id; a DM:
``dm-<user id>``), served by the Runtime's channel workers, so channels run
concurrently and each one's turns run in order. The bot answers where the
access policy (``bot.discord_front.access``) allows, shows typing while a turn
runs (and, past ``discord.status_after_s``, a status message naming the current
step, deleted when the reply is sent), saves the user's attachments into the channel's workspace and uploads
the files the agent sent. A full queue answers with the Busy message, and a
failed turn with a short apology; neither ends the handler.

A ✅ or ❌ reaction on a bot reply labels that reply's episode accepted or
rejected, and a 🗑 has it forgotten, when it comes from the episode's author
or an admin (``bot.labelling``); removing a ✅ or ❌ takes that label back.
Each sent reply is recorded in the store as a ``discord_reply`` event with
the author's user id, so reactions on replies from before a restart still
find their episode and its author; raw reaction events make uncached
messages work too.

One client process sends for every channel, so discord.py's own 429
handling covers all of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING

import discord
from discord.ext import commands

from bot import labelling
from bot.channels import Busy
from bot.commands import is_admin
from bot.disk.workspaces import SpaceRefused
from bot.discord_front.access import (
    Origin,
    channel_ids,
    channel_key,
    is_allowed,
    member_role_ids,
    needs_mention,
    origin_of,
    strip_mentions,
)
from bot.discord_front.render import (
    TurnStatuses,
    outgoing_files,
    save_attachments,
    send_reply,
    split_reply,
    upload_limit,
)
from bot.discord_front.slash import add_admin_commands
from bot.night.jobs import night_line

if TYPE_CHECKING:
    from bot.agent.loop import TurnResult
    from bot.night.report import NightReport
    from bot.runtime import Runtime
    from core.storage.store import Store

__all__ = ["NightshiftBot", "ReplyIndex", "run_discord", "split_reply"]

logger = logging.getLogger("nightshift.discord")
REACTION_LABELS = labelling.REACTION_LABELS
REPLY_EVENT = labelling.REPLY_EVENT
ASLEEP = ("I'm asleep: tonight's training has the GPU. Your message is queued, and I'll "
          "answer when I wake.")
TURN_FAILED = ("Sorry, something went wrong while answering that; the error is logged. "
               "Please try again.")


async def fetch_role_ids(user_id: int, guilds) -> frozenset[int]:
    """The roles a DM's author holds in the servers the bot shares with them, asked of
    Discord (one member request per server; no privileged intent needed). A server
    that cannot answer counts as no roles: the DM is then refused, never let through."""
    roles: set[int] = set()
    for guild in guilds:
        try:
            member = await guild.fetch_member(user_id)
        except discord.HTTPException:  # not a member there (NotFound), or Discord failed
            continue
        roles.update(role.id for role in member.roles)
    return frozenset(roles)


def default_intents() -> discord.Intents:
    """What the bot needs; members (a privileged intent) is not among them."""
    wanted = discord.Intents.none()
    wanted.guilds = True
    wanted.guild_messages = True
    wanted.dm_messages = True
    wanted.message_content = True
    wanted.guild_reactions = True
    wanted.dm_reactions = True
    return wanted


class ReplyIndex:
    """Which episode each bot reply belongs to.

    The store is the truth (one ``discord_reply`` event per sent message); the
    dict is a cache, filled from the store on first use. This process is the
    only writer of those events, so after that load a miss means "not a reply".
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._episodes: dict[int, int] = {}
        self._loaded = False

    async def record(self, channel: str, episode_id: int, message_ids: list[int],
                     author_id: int | None = None) -> None:
        for message_id in message_ids:
            await self._store.add_event(channel, episode_id, REPLY_EVENT,
                                        {"message_id": message_id, "author_id": author_id})
            self._episodes[message_id] = episode_id

    async def episode_of(self, message_id: int) -> int | None:
        if not self._loaded:
            for event in await self._store.events(REPLY_EVENT):
                self._episodes.setdefault(int(event["payload"]["message_id"]),
                                          event["episode_id"])
            self._loaded = True
        return self._episodes.get(message_id)


class NightshiftBot(commands.Bot):
    """The bot; it holds the Runtime but does not own it (the caller closes it)."""

    def __init__(self, rt: Runtime, *, intents: discord.Intents | None = None) -> None:
        # ``intents`` is for tests: dpytest makes its members through the member cache.
        super().__init__(command_prefix=rt.config.discord.command_prefix,
                         intents=intents or default_intents(),
                         help_command=None,
                         # The model writes the replies: it must never ping @everyone or roles.
                         allowed_mentions=discord.AllowedMentions(
                             everyone=False, users=False, roles=False, replied_user=True))
        self.rt = rt
        self.replies = ReplyIndex(rt.store)
        self.night_messages: dict[int, discord.Message] = {}  # job id -> its progress message
        self.statuses = TurnStatuses(rt.config.discord.status_after_s)
        rt.agent.progress = self.statuses.update
        add_admin_commands(self, rt)
        rt.night.listeners.append(self.night_progress)
        rt.announcers.append(self.announce)
        if rt.reports is not None:
            rt.reports.listeners.append(self.send_report)

    async def setup_hook(self) -> None:
        # Publish the slash commands. A failure leaves the chat working, so it only warns.
        try:
            synced = await self.tree.sync()
            logger.info("synced %d slash commands", len(synced))
        except discord.HTTPException as exc:
            logger.warning("could not sync the slash commands: %s", exc)

    async def night_progress(self, job: dict) -> None:
        """Edit one message per night with its state, in the channel that asked for it."""
        text = night_line(job)
        message = self.night_messages.get(job["id"])
        if message is not None:
            await message.edit(content=text)
            return
        channel_id = str(job["args"].get("channel", ""))
        channel = self.get_channel(int(channel_id)) if channel_id.isdigit() else None
        if channel is not None:
            self.night_messages[job["id"]] = await channel.send(text)

    async def announce(self, channel_key: str, text: str) -> None:
        """What the bot says on its own (sleep, a swarm member's reply), in its channel."""
        channel = self.get_channel(int(channel_key)) if channel_key.isdigit() else None
        if channel is None:
            logger.info("announcement with no Discord channel (%r): %s", channel_key, text)
            return
        for piece in split_reply(text):
            await channel.send(piece)

    async def send_report(self, report: NightReport) -> None:
        """A night's report in its channel: the text, then its plots attached as PNGs."""
        key = report.channel
        channel = self.get_channel(int(key)) if key.isdigit() else None
        if channel is None:
            logger.info("night report #%s with no Discord channel (%r)", report.job_id, key)
            return
        for piece in split_reply(report.text):
            await channel.send(piece)
        if not report.files:
            return
        # The plots follow in a message of their own (as the agent's files do), so the
        # text arrives whatever happens to the upload.
        files = [discord.File(path, filename=path.name) for path in report.files]
        try:
            await channel.send(f"Night #{report.job_id}: plots", files=files)
        finally:
            for file in files:
                file.close()

    async def on_ready(self) -> None:
        logger.info("logged in to Discord as %s", self.user)

    # -- messages ------------------------------------------------------------------

    async def on_message(self, message: discord.Message) -> None:
        if message.author.bot or self.user is None:  # other bots, and ourselves
            return
        origin = origin_of(message.author, message.channel, self.guilds)
        if origin.is_dm and self.rt.config.discord.allowed_role_ids and not origin.role_ids:
            # Without the members intent the cache rarely holds the author: ask Discord.
            origin = dataclasses.replace(origin, role_ids=await fetch_role_ids(
                message.author.id, self.guilds))
        if not is_allowed(self.rt.config, origin):
            return
        ctx = await self.get_context(message)
        if ctx.valid:  # a prefix command such as !sleep; it checks its own caller
            await self.invoke(ctx)
            return
        text = self._addressed_text(message, origin, self.user.id)
        if text is not None:
            await self._answer(message, text)

    def _addressed_text(self, message: discord.Message, origin: Origin,
                        me: int) -> str | None:
        """The text meant for the agent, or None when the message is not for us."""
        mentioned = any(user.id == me for user in message.mentions)
        if needs_mention(self.rt.config, origin) and not mentioned:
            return None
        text = strip_mentions(message.content, [me])
        return text if text or message.attachments else None

    async def _answer(self, message: discord.Message, text: str) -> None:
        key = channel_key(message.channel, message.author.id)
        if self.rt.night.server_paused:
            await send_reply(message, ASLEEP)
        async with message.channel.typing(), self.statuses.showing(key, message.channel):
            outcome = await self._turn(key, message, text)
        if isinstance(outcome, str):
            await send_reply(message, outcome)
            return
        workspace = self.rt.spaces.context(key).workspace
        files, skipped = outgoing_files(workspace, outcome.files, upload_limit(message))
        try:
            sent = await send_reply(message, "\n".join([outcome.reply, *skipped]), files)
        finally:
            for file in files:
                file.close()
        await self.replies.record(key, outcome.episode_id, [m.id for m in sent],
                                  message.author.id)

    async def _turn(self, key: str, message: discord.Message, text: str) -> TurnResult | str:
        """Save the attachments and run the turn; or the text to answer instead (busy, failed)."""
        try:
            if self.rt.workers.full(key):  # refused anyway: its attachments are not saved
                raise Busy(key, self.rt.config.agent.queue_size)
            # A new thread's workspace counts against the person who started it.
            starter = getattr(message.channel, "owner_id", None)
            ctx = self.rt.spaces.context(key, owner=f"user-{starter}" if starter else None)
            quota = self.rt.config.sandbox.workspace_quota_mb << 20
            notes = await save_attachments(message.attachments, ctx.workspace, quota_bytes=quota,
                                           disk=ctx.services.disk, channel=key)
            prompt = "\n".join([text, *notes]).strip()
            return await self.rt.turn(key, prompt, message.author.display_name)
        except (Busy, SpaceRefused) as exc:
            return str(exc)
        except asyncio.CancelledError:
            raise
        except Exception:  # logged here; the user gets a short answer, the handler goes on
            logger.exception("turn in #%s failed", key)
            return TURN_FAILED

    # -- reactions -------------------------------------------------------------------

    async def on_raw_reaction_add(self, payload: discord.RawReactionActionEvent) -> None:
        await self._reaction(payload, added=True)

    async def on_raw_reaction_remove(self, payload: discord.RawReactionActionEvent) -> None:
        await self._reaction(payload, added=False)

    async def _reaction(self, payload: discord.RawReactionActionEvent, added: bool) -> None:
        """A label (✅ ❌, added or taken back) or a forget (🗑) on one of our replies."""
        emoji = str(payload.emoji)
        if emoji not in REACTION_LABELS and emoji != labelling.FORGET_REACTION:
            return
        if self.user is None or payload.user_id == self.user.id:
            return
        if payload.member is not None and payload.member.bot:
            return
        origin = await self._reaction_origin(payload)
        if origin is None:  # where it came from cannot be told, and a list might block it
            return
        if origin.is_dm and self.rt.config.discord.allowed_role_ids and not origin.role_ids:
            origin = dataclasses.replace(origin, role_ids=await fetch_role_ids(
                payload.user_id, self.guilds))
        if not is_allowed(self.rt.config, origin):
            return
        episode = await self.replies.episode_of(payload.message_id)
        if episode is None:  # not one of our replies
            return
        # A removal carries no member (so no roles): taking back one's own label needs none.
        admin = is_admin(self.rt.config, payload.user_id, origin.role_ids)
        try:
            if emoji == labelling.FORGET_REACTION:
                what = (await labelling.forget(self.rt.store, episode, payload.user_id, admin,
                                               self.rt.spaces) if added else None)
            else:
                what = await labelling.label_reaction(self.rt.store, episode, emoji,
                                                      payload.user_id, admin, added)
        except ValueError as exc:
            logger.warning("reaction on episode %s not applied: %s", episode, exc)
            return
        if what:
            logger.info("reaction: %s", what)

    async def _reaction_origin(self, payload: discord.RawReactionActionEvent) -> Origin | None:
        """Who reacted where. A channel missing from the cache is asked of Discord: its id
        alone lost its parent and category, and a category's block list missed it. When
        Discord cannot say either, None (ignored) if any channel is blocked."""
        member = payload.member
        channel = self.get_channel(payload.channel_id)
        if channel is None and payload.guild_id is not None:
            try:
                channel = await self.fetch_channel(payload.channel_id)
            except (discord.HTTPException, discord.InvalidData) as exc:
                logger.warning("reaction in channel %s: cannot look it up (%s)",
                               payload.channel_id, exc)
                if self.rt.config.discord.blocked_channel_ids:
                    return None
        ids = channel_ids(channel) if channel is not None else frozenset({payload.channel_id})
        if payload.guild_id is None:  # a DM: the roles the user holds in our servers
            roles = member_role_ids(payload.user_id, self.guilds)
        else:
            roles = frozenset(r.id for r in member.roles) if member is not None else frozenset()
        return Origin(payload.user_id, roles, ids, payload.guild_id is None)


async def run_discord(rt: Runtime, token: str) -> None:
    """Run the bot until it stops or is cancelled; it is closed either way."""
    bot = NightshiftBot(rt)
    async with bot:  # __aexit__ closes the bot, on cancellation too
        await bot.start(token)
