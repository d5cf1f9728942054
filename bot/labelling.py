"""Who may label an episode or have it forgotten, and the acts themselves.

An episode's *author* is the person whose message started it. The Discord
front end records the author's user id with each reply it sends (the
``discord_reply`` events), so the rights hold after a restart too. The author
or an admin may:

- label the episode: ✅ = accepted, ❌ = rejected. A person's labels are theirs:
  removing the reaction removes that label, and the latest standing label
  counts (``Episode.label``);
- have it forgotten (``/forget EPISODE`` or a 🗑 reaction): excluded from
  training and its text erased from the store (``core.storage.forgetting``), even
  while its turn still runs (the turn stops at its next write), and its copies
  elsewhere (``bot.forgetting``); the answer says what was erased and what is left.
  Forgetting cannot be undone, so removing the 🗑 does nothing.

Anyone else's reaction is ignored (and logged). An episode with no recorded
author (one from the console, or from before authors were recorded) can be
labelled or forgotten by admins only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from core.storage.events import Event

from bot.forgetting import erase_copies

if TYPE_CHECKING:
    from bot.channels import ChannelSpaces
    from core.storage.store import Store

logger = logging.getLogger("nightshift.labels")
REPLY_EVENT = Event.DISCORD_REPLY
CHECK, CROSS, WASTEBASKET = "\N{WHITE HEAVY CHECK MARK}", "\N{CROSS MARK}", "\N{WASTEBASKET}"
REACTION_LABELS = {CHECK: "accepted", CROSS: "rejected"}
FORGET_REACTION = WASTEBASKET
NOT_YOURS = ("Only the person whose message started episode #{episode}, or an admin, "
             "may {act} it.")


async def episode_author(store: Store, episode_id: int) -> int | None:
    """The user id whose message started the episode, as recorded with its replies."""
    for event in await store.events(REPLY_EVENT, episode_id=episode_id):
        author = event["payload"].get("author_id")
        if author is not None:
            return int(author)
    return None


async def may_handle(store: Store, episode_id: int, user_id: int, admin: bool) -> bool:
    return admin or await episode_author(store, episode_id) == user_id


async def label_reaction(store: Store, episode_id: int, emoji: str, user_id: int,
                         admin: bool, added: bool) -> str | None:
    """Apply one reaction (added or removed); what happened, or None when it is no label."""
    value = REACTION_LABELS.get(emoji)
    if value is None:
        return None
    if not added:  # only the giver's own label goes; no rights needed to take back one's own
        removed = await store.remove_label(episode_id, value, "reaction", user_id)
        return f"{removed} {value} label(s) of {user_id} removed from episode {episode_id}"
    if not await may_handle(store, episode_id, user_id, admin):
        return f"{user_id} may not label episode {episode_id}: ignored"
    await store.add_label(episode_id, value, "reaction", user_id)
    return f"episode {episode_id} labelled {value} by {user_id}"


async def forget(store: Store, episode_id: int, user_id: int, admin: bool,
                 spaces: ChannelSpaces | None = None) -> str:
    """``/forget``'s and 🗑's act; the text to show (raises ValueError for a bad episode).
    ``spaces``: the channels' tool contexts, to erase the notes and images it made and
    to list the files it left (without them only the store is seen)."""
    if not await may_handle(store, episode_id, user_id, admin):
        return NOT_YOURS.format(episode=episode_id, act="forget")
    if await store.is_forgotten(episode_id):
        return f"Episode #{episode_id} was already forgotten."
    forgotten = await store.forget_episode(episode_id)
    try:
        erased, left = await erase_copies(store, forgotten, spaces)
    except Exception as exc:  # noqa: BLE001 - the store's erasure stands; say what failed
        logger.exception("copies of episode %s outside the store not erased", episode_id)
        erased, left = [], [f"the copies outside the store (notes, images, datasets, value "
                            f"memory) could not all be looked at: {exc}"]
    logger.info("episode %s forgotten by %s (%d steps erased; also %s)", episode_id, user_id,
                forgotten.steps, "; ".join(erased) or "nothing else")
    lines = [f"Episode #{episode_id} is forgotten: it will not be trained on, and its text "
             f"({forgotten.steps} messages) is erased from the store."]
    if forgotten.was_open:
        lines.append("Its turn had not ended; it stops at its next step, which is not stored.")
    if erased:
        lines.append("Also erased: " + "; ".join(erased) + ".")
    if left:
        lines.append("Not erased: " + "; ".join(left) + ".")
    return "\n".join(lines)
