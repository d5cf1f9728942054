"""Swarm turns and the routine cleaning of notes through the real llama.cpp server.

The embedded 135M model's choices are not asserted (they are not reliable); what is
asserted is the harness: each member's turn and the cleaning turn run as real turns,
are recorded as episodes, and their system prompts carry the swarm's task.
"""

from __future__ import annotations

import asyncio

import pytest

from bot.commands import Caller, run_command
from bot.runtime import Runtime
from core.config import Config
from core.config.routines import Swarm

ADMIN = Caller(0, (), "s1", "console", local=True)


@pytest.mark.slow
async def test_swarm_and_routine_cleaning_turns_run_on_the_embedded_model(
        tmp_path, served_gguf, free_port):
    config = Config()
    config.paths.data_dir = tmp_path
    config.model.gguf = served_gguf
    config.model.hf_dir = served_gguf.parent / "smollm2-135m-instruct-hf"
    config.server.port = free_port
    config.agent.temperature = 0
    config.agent.max_steps = 3
    config.agent.max_reply_tokens = 64
    # A short tool list keeps the prompt small: the CPUs are shared with other tests.
    config.agent.tools = ["board_read", "board_post", "write_file", "note_list", "note_search",
                          "note_create", "note_delete"]
    config.server.request_timeout_s = 300
    config.swarms.teams = [Swarm(name="pair", channels=["s1", "s2"])]
    rt = await Runtime.start(config)
    said: list[tuple[str, str]] = []

    async def listen(channel: str, text: str) -> None:
        said.append((channel, text))

    rt.announcers.append(listen)
    try:
        answer = await run_command(rt, ADMIN, "swarm start", swarm="pair",
                                   task="Write the word hello to a file named hello.txt.")
        assert "2 of 2 channels" in answer.text, answer.text
        for _ in range(3000):  # two turns on shared CPUs: minutes at worst
            if len(said) == 2:
                break
            await asyncio.sleep(0.1)
        assert sorted(c for c, _ in said) == ["s1", "s2"]
        assert not rt.rounds.busy
        rt.spaces.services.notes.add("s1", "The answer is 42.")
        cleaned = await run_command(rt, ADMIN, "notes-clean")
        episodes = await rt.store.episodes_since(0)
    finally:
        await rt.close()
    assert cleaned.text.startswith("Routine cleaning (episode #3): 1 notes before"), cleaned.text
    by_channel = {}
    for episode in episodes:
        by_channel.setdefault(episode.channel_id, []).append(episode)
    for channel in ("s1", "s2"):
        first = by_channel[channel][0]
        assert first.status in ("complete", "aborted")
        assert "Write the word hello" in first.steps[0].content  # the system prompt's section
        assert any(s.role == "assistant" for s in first.steps)
    cleaning = by_channel["s1"][1]
    assert "Routine cleaning of your notes" in cleaning.steps[1].content
