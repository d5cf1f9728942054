"""What ``/forget`` does outside the store, and what it says is left.

``core.storage.forgetting`` erases the episode in the store and hands back its steps as
they were; from them this module finds the copies elsewhere and erases them:

- the notes it wrote (``note_create``: by the id its result gave, and by the text its
  call carried, in case the turn was stopped before its result was stored);
- the images it viewed, from the image cache, unless a step of an episode that is not
  forgotten refers to the same file;
- the rows of every night's dataset on disk that carry its text, and the value memory's
  memories made from it (``core.storage.copies``; if a night holds the memory, that
  night purges them itself before it lets it go).

And it lists what it leaves, and why (the reply says it; the README's threat model too):

- the files it saved or changed in the channel's workspace (the user's attachments, what
  the agent wrote), with their undo history: they are the channel's files, which the
  user may still want; the file tools and /undo reach them;
- releases whose night trained on it: weights cannot unlearn an example. A candidate is
  refused by /promote; a live or retired one is named, for /rollback.

A turn still running when its episode is forgotten is stopped at its next write, which
the store refuses (``forget_refused_step`` erases what that step's tool made).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.storage.copies import erased_texts, purge_value_memory, scrub_nights
from core.storage.forgetting import Forgotten
from core.storage.schema import Step

if TYPE_CHECKING:
    from bot.channels import ChannelSpaces
    from core.storage.store import Store

logger = logging.getLogger("nightshift.forget")
_SAVED_NOTE = re.compile(r"^saved note ([0-9a-f]{6,64}) ")  # tools.notes.note_create's result
_ATTACHED = re.compile(r"^\[attached: (.+) \([^()]*\)\]$", re.M)  # discord_front.render's line
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_LISTED = 8  # paths named in the reply; the rest are counted


def _calls(step: Step, name: str) -> list[dict]:
    """The arguments of ``step``'s calls of tool ``name``."""
    out = []
    for call in step.tool_calls or ():
        function = call.get("function") or {}
        if function.get("name") == name:
            arguments = function.get("arguments")
            try:
                arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
            except ValueError:
                continue
            if isinstance(arguments, dict):
                out.append(arguments)
    return out


def written_notes(steps: list[Step]) -> tuple[set[str], set[str]]:
    """(note ids its results gave, note texts its calls carried) of ``note_create``."""
    ids = {m[1] for s in steps if s.role == "tool" and s.name == "note_create"
           and (m := _SAVED_NOTE.match(s.content or ""))}
    texts = {str(a.get("text", "")).strip() for s in steps for a in _calls(s, "note_create")}
    return ids, texts - {""}


def viewed_images(steps: list[Step]) -> dict[str, str]:
    """sha256 -> cache file name of the images its steps refer to."""
    out = {}
    for step in steps:
        image = (step.meta or {}).get("image")
        if isinstance(image, dict) and _DIGEST.match(str(image.get("sha256", ""))):
            out[image["sha256"]] = Path(str(image.get("cache_path", ""))).name
    return out


def attachments(steps: list[Step]) -> list[str]:
    """The workspace paths of the files saved from its messages' attachments."""
    return [m for s in steps if s.role == "user" for m in _ATTACHED.findall(s.content or "")]


def _erase_notes(notes: Any, channel: str, ids: set[str], texts: set[str]) -> int:
    if notes is None or not (ids or texts):
        return 0
    found = {n["id"] for n in notes.list(channel, include_shared=True, limit=1 << 30)
             if n["id"] in ids or n["text"].strip() in texts}
    return sum(1 for note_id in found if notes.delete(channel, note_id))


def _erase_images(cache: Any, names: list[str]) -> int:
    """Delete the cache files (plain names inside the cache; never a path from elsewhere).
    ``cache`` is the tools' image cache: a folder, or an object with its ``folder`` (and a
    ``discard(name)`` that keeps its own accounting, when it has one)."""
    if cache is None:
        return 0
    folder, discard = Path(getattr(cache, "folder", cache)), getattr(cache, "discard", None)
    gone = 0
    for name in names:
        if not name or Path(name).name != name or not _DIGEST.match(name[:64]):
            continue
        if discard is not None:
            gone += bool(discard(name))
            continue
        try:
            (folder / name).unlink()
            gone += 1
        except FileNotFoundError:
            pass
    return gone


def _changed_paths(journal: Any, start: float, end: float) -> list[str]:
    """Workspace paths the undo journal recorded changing during the episode."""
    done, undone = journal.log(limit=journal.keep + 64)
    return sorted({key[1] for entry in (*done, *undone) if start <= entry.time <= end
                   for change in entry.changes if (key := change.key)[0] == "ws"})


async def erase_images(store: Store, cache: Any, images: dict[str, str]) -> int:
    """Delete the cached images no episode that is not forgotten refers to; how many."""
    if not images or cache is None:
        return 0
    kept = await store.images_in_use(set(images))
    return await asyncio.to_thread(_erase_images, cache,
                                   [n for d, n in images.items() if d not in kept])


async def forget_refused_step(store: Store, ctx: Any, step: Step) -> None:
    """A running turn's tool step refused because its episode was forgotten meanwhile:
    the note or the cached image its tool made after the forget is erased too."""
    services = getattr(ctx, "services", None)  # a bare context (tests) lends nothing
    if services is None:
        return
    await asyncio.to_thread(_erase_notes, services.notes, ctx.channel, *written_notes([step]))
    await erase_images(store, services.image_cache, viewed_images([step]))


async def erase_copies(store: Store, forgotten: Forgotten, spaces: ChannelSpaces | None
                       ) -> tuple[list[str], list[str]]:
    """Erase the copies outside the store; (what was erased, what is left and why)."""
    episode, erased, left = forgotten.episode, [], []
    steps, channel = episode.steps, episode.channel_id
    if forgotten.summaries:
        erased.append(f"{forgotten.summaries} later summaries that read it")
    if forgotten.records:
        erased.append(f"{forgotten.records} night ledger records made from it")
    if spaces is not None:
        ctx = spaces.context(channel)
        count = await asyncio.to_thread(_erase_notes, ctx.services.notes, channel,
                                        *written_notes(steps))
        if count:
            erased.append(f"{count} notes it wrote")
        count = await erase_images(store, ctx.services.image_cache, viewed_images(steps))
        if count:
            erased.append(f"{count} cached images")
        erased += await _erase_night_copies(store, forgotten, spaces.data_dir, left)
        left += await _workspace_left(ctx, steps, episode.started_at,
                                      episode.ended_at or time.time())
    left += await _releases_left(store, episode.id)
    if not forgotten.checkpointed:
        left.append("an old copy in the store's write-ahead log, until a later checkpoint "
                    "truncates it (the store was busy: a night reading it, or turns writing)")
    return erased, left


async def _erase_night_copies(store: Store, forgotten: Forgotten, data_dir: Path,
                              left: list[str]) -> list[str]:
    episode, erased = forgotten.episode, []
    texts = erased_texts([s.content for s in episode.steps])
    scrubbed = await asyncio.to_thread(scrub_nights, data_dir / "nights", {episode.id}, texts)
    if scrubbed:
        erased.append(f"{sum(scrubbed.values())} rows of {len(scrubbed)} night datasets")
    everyone = await store.forgotten_episodes()  # purged together: one pass over the memory
    purged = await asyncio.to_thread(purge_value_memory, data_dir, everyone)
    if purged is None:
        left.append("value memories made from it, until the night now running lets the "
                    "memory go (it deletes them first)")
    elif purged:
        erased.append(f"{purged} value memories")
    return erased


async def _workspace_left(ctx: Any, steps: list[Step], start: float, end: float) -> list[str]:
    """The files the episode left in the workspace: its attachments, what it changed."""
    left = []
    saved = await asyncio.to_thread(_present, ctx.workspace, attachments(steps))
    if saved:
        left.append("the attachments saved in the channel's workspace: " + _names(saved))
    try:
        changed = await asyncio.to_thread(_changed_paths, ctx.journal, start, end)
    except (OSError, ValueError) as exc:  # an unreadable journal must not fail the forget
        logger.warning("journal of %s not read for /forget: %s", ctx.channel, exc)
        changed = []
    changed = [p for p in changed if p not in saved]
    if changed:
        left.append("the workspace files its turn changed, and their undo history: "
                    + _names(changed))
    return left


async def _releases_left(store: Store, episode_id: int) -> list[str]:
    nights = await store.nights_trained_on(episode_id)
    served = [r for r in await store.releases() if r["state"] in ("live", "retired")
              and (r["meta"].get("night") in nights
                   or episode_id in (r["meta"].get("trained_episodes") or ()))]
    return [f"the weights of release #{r['id']} ({r['state']}), whose night trained on it: a "
            "model cannot unlearn an example" + (" (/rollback stops serving it)"
                                                 if r["state"] == "live" else "")
            for r in served]


def _present(workspace: Any, paths: list[str]) -> list[str]:
    """The paths still in the workspace (a path that would lead out of it is not looked at:
    the line came from a message, which anyone can write)."""
    found = []
    for path in dict.fromkeys(paths):
        try:
            if os.path.lexists(workspace.resolve(path)):
                found.append(path)
        except (OSError, ValueError):
            continue
    return found


def _names(paths: list[str]) -> str:
    more = f" and {len(paths) - _LISTED} more" if len(paths) > _LISTED else ""
    return ", ".join(paths[:_LISTED]) + more
