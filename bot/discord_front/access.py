"""Who the Discord bot answers, and where: a pure policy over the config.

The rules follow llmcord's: an empty allow list allows everyone (or every
channel), a block always wins. Admins pass the allow lists (so a locked-down
server can still be run by them) but not the block lists. A channel matches a
list by its own id, its parent's (a thread's channel) or its category's.

Direct messages are off unless ``allow_dms`` (default false: a DM is a way
round the server's rules), and when on they follow the same rules as any
channel: with ``allowed_channel_ids`` set, a DM is not one of those channels;
with ``allowed_role_ids`` set, the user must hold such a role in a server the
bot shares with them (a DM carries no roles, so the front end looks the
member up: in the cache through ``origin_of(..., guilds)``, else by asking
Discord, ``bot.discord_front.app.fetch_role_ids``).

Nothing here touches the network, so every rule is tested with plain values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bot.commands import Caller, is_admin
from core.config import Config


@dataclass(frozen=True)
class Origin:
    """Where a message or reaction came from, as the policy needs it."""

    user_id: int
    role_ids: frozenset[int]
    channel_ids: frozenset[int]  # the channel, its parent and its category
    is_dm: bool


def channel_key(channel: Any, user_id: int) -> str:
    """The agent's channel key: the Discord channel id, or ``dm-<user id>`` for a DM.

    Keying DMs by the user (not the DM channel id) keeps one person's private
    workspace the same whichever DM channel object Discord hands us.
    """
    if getattr(channel, "guild", None) is None:
        return f"dm-{user_id}"
    return str(channel.id)


def role_ids(user: Any) -> tuple[int, ...]:
    """A Member's role ids; a plain User (a DM) has none."""
    return tuple(role.id for role in getattr(user, "roles", ()) or ())


def channel_ids(channel: Any) -> frozenset[int]:
    ids = {getattr(channel, "id", None), getattr(channel, "parent_id", None),
           getattr(channel, "category_id", None)}
    return frozenset(i for i in ids if i is not None)


def member_role_ids(user_id: int, guilds: Iterable[Any]) -> frozenset[int]:
    """The roles a user holds in the servers the bot shares with them (for a DM)."""
    roles: set[int] = set()
    for guild in guilds:
        member = guild.get_member(user_id)
        if member is not None:
            roles.update(role_ids(member))
    return frozenset(roles)


def origin_of(user: Any, channel: Any, guilds: Iterable[Any] = ()) -> Origin:
    """``guilds``: the bot's servers, where a DM's author's roles are looked up."""
    is_dm = getattr(channel, "guild", None) is None
    roles = member_role_ids(user.id, guilds) if is_dm else frozenset(role_ids(user))
    return Origin(user.id, roles, channel_ids(channel), is_dm)


def caller_of(user: Any, channel: Any) -> Caller:
    return Caller(user.id, role_ids(user), channel_key(channel, user.id), f"{user} ({user.id})")


def is_blocked(config: Config, origin: Origin) -> bool:
    """Whether a block list names this user, one of their roles, or this channel (its
    parent or category): then nothing is answered there, a slash command included."""
    d = config.discord
    return (origin.user_id in d.blocked_user_ids or bool(origin.role_ids & set(d.blocked_role_ids))
            or bool(origin.channel_ids & set(d.blocked_channel_ids)))


def is_allowed(config: Config, origin: Origin) -> bool:
    """Whether the bot may answer this user in this channel (block lists win)."""
    d = config.discord
    if is_blocked(config, origin):
        return False
    if is_admin(config, origin.user_id, origin.role_ids):
        return True
    if origin.is_dm and not d.allow_dms:
        return False
    allow_all_users = not d.allowed_user_ids and not d.allowed_role_ids
    user_ok = (allow_all_users or origin.user_id in d.allowed_user_ids
               or bool(origin.role_ids & set(d.allowed_role_ids)))
    channel_ok = not d.allowed_channel_ids or bool(origin.channel_ids & set(d.allowed_channel_ids))
    return user_ok and channel_ok


def needs_mention(config: Config, origin: Origin) -> bool:
    """Server channels need a mention unless configured otherwise; DMs never do."""
    d = config.discord
    if origin.is_dm or not d.require_mention:
        return False
    return not origin.channel_ids & set(d.no_mention_channel_ids)


def strip_mentions(content: str, user_ids: Iterable[int]) -> str:
    """The message text without the bot's own mention (``<@id>`` or ``<@!id>``)."""
    for user_id in user_ids:
        content = re.sub(rf"<@!?{user_id}>", "", content)
    return content.strip()
