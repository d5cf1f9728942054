"""Channel workers: order within a channel, concurrency across channels, busy replies,
and no cross-talk between 50 channels running the real tools and store."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from bot.channels import Busy, ChannelWorkers
from bot.runtime import Runtime
from core.config import Config
from tests.scripted import ScriptedLLM, call, say


class FakeServer:
    def __init__(self, gguf: Path) -> None:
        self.gguf, self.base_url, self.ready = gguf, "http://127.0.0.1:9/v1", True
        self.pid, self.restarts, self.last_restart_reason = None, 0, None

    async def wait_ready(self, timeout=None):
        return None

    async def restart(self, reason):
        self.restarts += 1

    async def stop(self):
        return None


async def test_messages_in_one_channel_are_handled_in_order_and_channels_run_concurrently():
    log, gate = [], asyncio.Event()

    async def handle(channel, text, speaker):
        log.append(("start", channel, text))
        if channel == "slow":
            await gate.wait()
        log.append(("end", channel, text))
        return text

    workers = ChannelWorkers(handle, queue_size=8)
    slow = [workers.enqueue("slow", f"s{i}") for i in range(3)]
    fast = await workers.submit("fast", "f0")
    assert fast == "f0"  # finished while #slow is still blocked
    gate.set()
    assert await asyncio.gather(*slow) == ["s0", "s1", "s2"]
    slow_log = [entry for entry in log if entry[1] == "slow"]
    assert slow_log == [(k, "slow", f"s{i}") for i in range(3) for k in ("start", "end")]
    await workers.close()


async def test_a_full_queue_answers_busy_and_loses_nothing_queued():
    gate = asyncio.Event()

    async def handle(channel, text, speaker):
        await gate.wait()
        return text

    workers = ChannelWorkers(handle, queue_size=2)
    first = workers.enqueue("c", "1")
    await asyncio.sleep(0)  # the worker takes "1"; the queue is empty again
    assert not workers.full("c") and not workers.full("elsewhere")
    queued = [workers.enqueue("c", "2"), workers.enqueue("c", "3")]
    assert workers.full("c")  # the front end then saves no attachment for a refused turn
    with pytest.raises(Busy, match="busy"):
        workers.enqueue("c", "4")
    gate.set()
    assert await asyncio.gather(first, *queued) == ["1", "2", "3"]
    await workers.close()


async def test_a_failing_turn_does_not_stop_its_channel():
    async def handle(channel, text, speaker):
        if text == "boom":
            raise RuntimeError("harness bug")
        return text

    workers = ChannelWorkers(handle)
    with pytest.raises(RuntimeError):
        await workers.submit("c", "boom")
    assert await workers.submit("c", "after") == "after"
    await workers.close()


def nonce_script(messages, kwargs):
    """Write the channel's nonce to a file, read it back, and answer with it."""
    last = messages[-1]
    if last["role"] == "user":
        nonce = last["content"].split()[-1]
        return call("write_file", {"path": "nonce.txt", "content": nonce}, "w")
    if last["name"] == "write_file":
        return call("read_file", {"path": "nonce.txt"}, "r")
    return say("my nonce is " + re.search(r"N\d{3}x\d{3}", last["content"]).group())


async def test_fifty_channels_in_parallel_never_leak_into_each_other(tmp_path):
    config = Config()
    config.paths.data_dir = tmp_path
    rt = await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"),
                             llm=ScriptedLLM(nonce_script), start_server=False)
    nonces = {f"ch{i}": f"N{i:03d}x{i * 7919 % 1000:03d}" for i in range(50)}
    try:
        results = await asyncio.gather(*(rt.turn(c, f"remember {n}") for c, n in nonces.items()))
        leaks = 0
        every = set(nonces.values())
        for (channel, nonce), result in zip(nonces.items(), results):
            assert result.ok, result.reply
            others = every - {nonce}
            seen = set(re.findall(r"N\d{3}x\d{3}", result.reply))
            leaks += len(seen & others) + (nonce not in seen)
            history = await rt.store.channel_history(channel, 100)
            text = json.dumps([(s.content, s.tool_calls) for s in history])
            leaks += len(set(re.findall(r"N\d{3}x\d{3}", text)) & others)
            workspace = rt.spaces.context(channel).workspace.root
            leaks += (workspace / "nonce.txt").read_text() != nonce
        assert leaks == 0
        episodes = await rt.store.episodes_since(0)
        assert len(episodes) == 50
        assert all([s.role for s in e.steps] == ["system", "user", "assistant", "tool",
                                                 "assistant", "tool", "assistant"]
                   for e in episodes)
    finally:
        await rt.close()


async def test_agent_tools_config_limits_the_tools_and_unknown_names_are_refused(tmp_path):
    from core.config import ConfigError

    config = Config()
    config.paths.data_dir = tmp_path
    config.agent.tools = ["read_file", "write_file"]
    rt = await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"),
                             llm=ScriptedLLM([say("ok")]), start_server=False)
    try:
        assert rt.registry.names() == ["read_file", "write_file"]
    finally:
        await rt.close()
    config.agent.tools = ["read_file", "rm_rf"]
    with pytest.raises(ConfigError, match=r"agent.tools = \['rm_rf'\] names unknown tools"):
        await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"),
                            llm=ScriptedLLM([]), start_server=False)


async def test_scratch_is_cleared_after_a_turn_when_configured_and_undo_restores_it(tmp_path):
    config = Config()
    config.paths.data_dir = tmp_path
    config.agent.clear_scratch_after_turn = True
    config.agent.tools = "all"  # undo is not in the embedded model's core set
    script = [call("write_file", {"path": "scratch/tmp.txt", "content": "draft"}), say("done")]
    rt = await Runtime.start(config, supervisor=FakeServer(tmp_path / "m.gguf"),
                             llm=ScriptedLLM(script), start_server=False)
    try:
        await rt.turn("c", "draft something")
        ctx = rt.spaces.context("c")
        assert not (ctx.workspace.root / "scratch/tmp.txt").exists()
        assert (await rt.registry.call("undo", {}, ctx)).ok
        assert (ctx.workspace.root / "scratch/tmp.txt").read_text() == "draft"
    finally:
        await rt.close()
