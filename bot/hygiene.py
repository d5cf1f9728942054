"""Notes hygiene: routine cleaning by the agent, and the wipe behind a confirmation.

``/notes-clean`` used to delete every note of a channel with no undo; an owner
who typed it expecting a tidy-up lost everything (seed lesson 3). Now it asks
the agent for a *routine cleaning*: a real turn on the channel's worker, with
its note tools, recorded and trained on like any other turn. The prompt lists
the near-duplicate groups the embedder found, so even a small model knows
where to start; the agent decides what to merge and delete. The outright
delete is ``/notes-wipe CONFIRM`` (``bot.admin.notes_wipe``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from tools.notes import MAX_DUPLICATE_SCAN

# A turn in a channel as a speaker: the runtime's ``turn`` (queued on the channel's worker).
Turn = Callable[[str, str, str], Awaitable[Any]]

ROUTINE_CLEANING = (
    "Routine cleaning of your notes. Call note_list to see them. Where several notes say the "
    "same thing, merge them: save one note with everything they say (note_create), then "
    "delete the old ones (note_delete). Delete notes that are outdated or empty. Keep every "
    "fact that appears only once. End with one line: how many notes you merged and deleted.")


NOTE_TOOLS = {"note_list", "note_search", "note_create", "note_delete"}


def cleaning_prompt(groups: list[list[str]], compared: bool = True) -> str:
    if not compared:
        return ROUTINE_CLEANING + ("\nThere are too many notes to compare them all for "
                                   "near-duplicates: use note_search to find similar ones.")
    if not groups:
        return ROUTINE_CLEANING + "\nNo near-duplicates were found by similarity."
    listed = "; ".join(", ".join(group) for group in groups)
    return ROUTINE_CLEANING + f"\nNear-duplicate notes found by similarity (ids): {listed}."


async def routine_clean(notes: Any, offered: Iterable[str], turn: Turn, channel: str) -> str:
    """One routine cleaning turn in ``channel``, by an agent offered the tools ``offered``,
    on the bot's note store ``notes`` (None: notes are off); the answer says what changed."""
    if notes is None:
        return "Notes are not enabled."
    missing = sorted(NOTE_TOOLS - set(offered))
    if missing:
        return (f"The agent is not offered the note tools it cleans with ({', '.join(missing)}). "
                "Fix: set agent.tools = \"all\", or list them in agent.tools.")
    before = await asyncio.to_thread(notes.count, channel, False)
    groups = await asyncio.to_thread(notes.duplicate_groups, channel)
    prompt = cleaning_prompt(groups, compared=before <= MAX_DUPLICATE_SCAN)
    result = await turn(channel, prompt, "routine cleaning")
    after = await asyncio.to_thread(notes.count, channel, False)
    return (f"Routine cleaning (episode #{result.episode_id}): {before} notes before, {after} "
            f"after.\n{result.reply}")


async def routine_clean_all(notes: Any, offered: Iterable[str], turn: Turn) -> str:
    """A routine cleaning turn in every channel that has notes (the weekly schedule)."""
    if notes is None:
        return "Notes are not enabled."
    stats = await asyncio.to_thread(notes.stats)
    channels = [s["channel"] for s in stats if s["channel"] != "shared" and s["notes"]]
    done = []
    for channel in channels:
        try:
            done.append(f"#{channel}: " + (await routine_clean(notes, offered, turn, channel)).splitlines()[0])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one channel's failure must not skip the others
            done.append(f"#{channel}: failed ({exc})")
    return "\n".join(done) or "no channel has notes"
