"""The agent through the real llama.cpp server and the embedded model."""

from __future__ import annotations

import pytest

from bot.runtime import Runtime
from core.config import Config


@pytest.mark.slow
async def test_embedded_model_makes_a_real_tool_call_that_is_stored_as_steps(
        tmp_path, served_gguf, free_port):
    config = Config()
    config.paths.data_dir = tmp_path
    config.model.gguf = served_gguf
    config.model.hf_dir = served_gguf.parent / "smollm2-135m-instruct-hf"
    config.server.port = free_port
    config.agent.temperature = 0
    config.agent.max_steps = 3
    config.agent.max_reply_tokens = 64
    rt = await Runtime.start(config)
    try:
        (rt.spaces.context("general").workspace.root / "hello.txt").write_text("hi\n")
        result = await rt.turn("general", "List the files in the current directory using list_dir.")
        episode = (await rt.store.episodes_since(0, "general"))[-1]
    finally:
        await rt.close()
    assert episode.id == result.episode_id
    calls = [s for s in episode.steps if s.role == "assistant" and s.tool_calls]
    assert calls, [(s.role, s.content) for s in episode.steps]
    first = calls[0]
    observation = episode.steps[first.seq + 1]
    assert observation.role == "tool"
    assert observation.name == first.tool_calls[0]["function"]["name"]
    assert observation.tool_call_id == first.tool_calls[0]["id"]
    if observation.name == "list_dir" and observation.meta["ok"]:
        assert "hello.txt" in observation.content
