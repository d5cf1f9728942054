"""Notes hygiene: /notes-clean is a routine cleaning turn by the agent, the wipe needs the
literal word CONFIRM, and the health tool counts notes and duplicates per channel.

These run the real runtime with its real note store (chromadb + the offline MiniLM)
and a scripted model that cleans the way the prompt asks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bot.commands import Caller, run_command
from bot.hygiene import routine_clean, routine_clean_all
from tests.discord_helpers import make_config, start_runtime
from tests.scripted import ScriptedLLM, call, say

ADMIN = Caller(0, (), "c1", "console", local=True)
DEPLOY_1 = "The deploy key is kept in vault at prod/deploy."
DEPLOY_2 = "The deploy key is stored in the vault under prod/deploy."
FRENCH = "Alice prefers answers in French."


def cleaner(messages: list[dict], kwargs: dict):
    """Merges the near-duplicates the prompt names: one note_create, then a note_delete each."""
    prompt = next(m["content"] for m in messages if m["role"] == "user")
    match = re.search(r"\(ids\): ([0-9a-f, ]+)\.", prompt)
    ids = match.group(1).split(", ") if match else []
    done = sum(1 for m in messages if m["role"] == "tool")
    if ids and done == 0:
        return call("note_create", {"title": "deploy key", "text": "Deploy key: vault prod/deploy"})
    if ids and done <= len(ids):
        return call("note_delete", {"note_id": ids[done - 1]}, f"call_{done}")
    return say(f"Merged {len(ids)} notes into 1 and deleted {len(ids)}.")


@pytest.fixture
async def rt(tmp_path: Path):
    config = make_config(tmp_path)
    config.agent.tools = "all"  # the embedded model's core set has no note tools
    rt = await start_runtime(config, ScriptedLLM(cleaner))
    notes = rt.spaces.services.notes
    for text in (DEPLOY_1, DEPLOY_2, FRENCH):
        notes.add("c1", text)
    notes.add("c2", FRENCH)
    yield rt
    await rt.close()


async def test_notes_clean_is_a_recorded_agent_turn_that_merges_duplicates(rt):
    notes = rt.spaces.services.notes
    assert [len(g) for g in notes.duplicate_groups("c1")] == [2]
    answer = await run_command(rt, ADMIN, "notes-clean")
    assert answer.text.startswith("Routine cleaning (episode #1): 3 notes before, 2 after.")
    assert answer.text.endswith("Merged 2 notes into 1 and deleted 2.")
    left = sorted(n["text"] for n in notes.list("c1"))
    assert left == sorted(["Deploy key: vault prod/deploy", FRENCH])  # the unique one kept
    assert notes.count("c2") == 1  # other channels untouched
    [episode] = await rt.store.episodes_since(0)
    assert episode.status == "complete" and episode.channel_id == "c1"
    assert [s.name for s in episode.steps if s.role == "tool"] == \
        ["note_create", "note_delete", "note_delete"]
    user = next(s for s in episode.steps if s.role == "user")
    assert user.name == "routine cleaning" and "Routine cleaning of your notes" in user.content


async def test_notes_wipe_needs_the_literal_word_confirm(rt):
    notes = rt.spaces.services.notes
    for confirm in ({}, {"confirm": "confirm"}, {"confirm": "yes"}):
        answer = await run_command(rt, ADMIN, "notes-wipe", **confirm)
        assert answer.text.startswith("Nothing deleted. /notes-wipe deletes all 3 notes")
        assert "/notes-wipe CONFIRM" in answer.text
    assert notes.count("c1", include_shared=False) == 3
    answer = await run_command(rt, ADMIN, "notes-wipe", confirm="CONFIRM")
    assert answer.text == "Wiped 3 notes of this channel."
    assert notes.count("c1", include_shared=False) == 0 and notes.count("c2") == 1
    assert await rt.store.episodes_since(0) == []  # the wipe is no agent turn


async def test_health_reports_this_channels_notes_only(rt):
    """It showed every channel's counts, dm-<user id> included, to any channel (issue 40)."""
    result = await rt.registry.call("health", {}, rt.spaces.context("c1"))
    assert result.ok
    line = next(line for line in result.output.splitlines() if line.startswith("notes"))
    assert line == "notes in this channel: 3 (1 duplicates at similarity >= 0.9)"
    other = await rt.registry.call("health", {}, rt.spaces.context("c2"))
    assert "notes in this channel: 1 (0 duplicates" in other.output and "c1" not in other.output


async def test_the_weekly_cleaning_visits_every_channel_with_notes(rt):
    text = await routine_clean_all(rt.spaces.services.notes, rt.registry.names(), rt.turn)
    lines = text.splitlines()
    assert lines[0].startswith("#c1: Routine cleaning (episode #") and "3 notes before, 2 after" \
        in lines[0]
    assert lines[1].startswith("#c2: Routine cleaning (episode #") and "1 notes before, 1 after" \
        in lines[1]


async def test_notes_clean_says_so_when_the_note_tools_are_not_offered(tmp_path):
    config = make_config(tmp_path)
    config.agent.tools = "auto"  # the embedded model's core set
    rt = await start_runtime(config, ScriptedLLM([say("should not run")]))
    try:
        text = await routine_clean(rt.spaces.services.notes, rt.registry.names(), rt.turn, "c1")
        assert "not offered the note tools" in text and 'agent.tools = "all"' in text
        assert await rt.store.episodes_since(0) == []  # no turn was run
    finally:
        await rt.close()


def test_the_cleaning_prompt_never_claims_no_duplicates_it_did_not_look_for():
    from bot.hygiene import cleaning_prompt

    assert "No near-duplicates were found" in cleaning_prompt([])
    too_many = cleaning_prompt([], compared=False)
    assert "too many notes to compare" in too_many and "No near-duplicates" not in too_many
    assert "a, b" in cleaning_prompt([["a", "b"]])
