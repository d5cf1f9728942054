"""Issue 11, part 3: replies and turns (the stray check, cut replies, vision compaction,
messages during a single-GPU night).

Each test here failed on the code before the fix it names.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from bot.agent.loop import CUT_NOTE
from bot.agent.stray import STRAY_CONTINUE, STRAY_QUESTION
from bot.channels import RuleStrayDetector
from serving.client import LLM, Reply
from tests.scripted import call, say
from tests.test_agent import AddTools, Result, make_agent, store  # noqa: F401 - a fixture
from tests.test_server import fake_openai_server, make_config


@pytest.mark.parametrize("reply", [
    "Let me know if you need anything else.",
    "Here is the answer: 42. Let me know if you need anything else!",
    "I'll write the file next. Actually, it is done. I hope this helps.",
    "Done. I'll be happy to help further.",
    "I can add tests too. I'll add them if you want.",
    "I'll keep that in mind.",
])
def test_ordinary_endings_are_not_flagged(reply):
    assert RuleStrayDetector().flag(reply, tool_steps=1) is None


@pytest.mark.parametrize("reply", [
    "I'll write the file next.",
    "Sure. Now let me check the output.",
    "Next, I will create the config file.",
])
def test_an_ending_that_promises_work_is_still_flagged(reply):
    assert RuleStrayDetector().flag(reply, tool_steps=1)


async def test_the_stray_probe_never_enters_later_history(store, tmp_path):  # noqa: F811
    script = [say("I'll add the numbers now:"), say('{"answer": "no"}'),
              call("add", {"a": 2, "b": 2}), say("The sum is 4."), say("You're welcome.")]
    agent, llm, _ = make_agent(store, script, tmp_path)
    await agent.turn("general", "add 2 and 2")
    await agent.turn("general", "thanks")
    later = json.dumps(llm.calls[-1][0])
    for probe in (STRAY_QUESTION, STRAY_CONTINUE, '\\"answer\\": \\"no\\"'):
        assert probe not in later
    assert "The sum is 4." in later and "I'll add the numbers now:" in later


async def test_a_reply_cut_at_the_token_limit_says_so(store, tmp_path):  # noqa: F811
    cut = Reply(content="Here are the first steps: one, two, thr", finish_reason="length",
                model="scripted")
    agent, llm, _ = make_agent(store, [cut], tmp_path, max_reply_tokens=64)
    result = await agent.turn("general", "list many steps")
    assert result.reply.startswith("Here are the first steps: one, two, thr")
    assert result.reply.endswith(CUT_NOTE.format(tokens=64))
    assert len(llm.calls) == 1  # the stray question is not asked of a cut reply


class LookTools(AddTools):
    """``add``, plus ``look``, which shows the model an image (as view_image does)."""

    def __init__(self, image: dict) -> None:
        super().__init__()
        self.image = image

    def schemas(self):
        return [*super().schemas(), {"type": "function", "function": {
            "name": "look", "description": "see an image",
            "parameters": {"type": "object", "properties": {}}}}]

    async def call(self, name, arguments, ctx):
        if name == "look":
            return Result(True, "an image", {"image": self.image})
        return await super().call(name, arguments, ctx)


async def test_compaction_never_pastes_an_image_into_the_summary_prompt(store, tmp_path):  # noqa: F811
    png = tmp_path / "cat.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40)
    summaries = []
    steps = iter([call("look", {}), call("add", {"a": 1, "b": 1}),
                  call("add", {"a": 2, "b": 2}), say("It is a cat.")])

    def script(messages, kwargs):
        last = messages[-1]["content"]
        if isinstance(last, str) and "Summarise this conversation" in last:
            summaries.append(last)
            return say("They looked at an image.")
        return next(steps)

    agent, llm, _ = make_agent(store, script, tmp_path, keep_recent_messages=2,
                               max_reply_tokens=64)
    agent.tools = LookTools({"cache_path": str(png), "mime": "image/png", "sha256": "ab" * 32})
    agent.config.model.vision = True
    agent.config.model.context_tokens = 512
    result = await agent.turn("general", "what is in the picture? " + "y" * 900)
    assert result.reply == "It is a cat."
    assert any("[image]" in s for s in summaries)
    assert not any("base64" in s or "image_url" in s for s in summaries)


class PausedServer:
    """A supervisor stopped on purpose (a single-GPU night) until ``wake``."""

    def __init__(self, base_url: str) -> None:
        self.base_url, self.paused = base_url, True
        self._ready = asyncio.Event()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def wait_ready(self, timeout=None):
        await asyncio.wait_for(self._ready.wait(), timeout)

    def wake(self) -> None:
        self.paused = False
        self._ready.set()


async def test_a_message_during_a_single_gpu_night_waits_for_the_morning(tmp_path, free_port):
    """The client's wait is bounded by the server timeouts (~700 s by default, 0.4 s here);
    a paused server must outlast it without the request failing."""
    config = make_config(tmp_path, free_port, server={
        "request_timeout_s": 0.1, "stop_grace_s": 0.1, "start_timeout_s": 0.1},
        watchdog={"restart_cooldown_s": 0})
    runner = await fake_openai_server(free_port)
    server = PausedServer(f"http://127.0.0.1:{free_port}/v1")
    try:
        async with LLM(config, server) as llm:
            request = asyncio.create_task(llm.chat([{"role": "user", "content": "hi"}]))
            await asyncio.sleep(1.5)  # several of the client's timeouts
            assert not request.done()
            server.wake()
            reply = await asyncio.wait_for(request, 10)
        assert reply.content == "OK"
    finally:
        await runner.cleanup()
