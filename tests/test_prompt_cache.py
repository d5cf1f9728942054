"""The prompt cache: nested states kept once, a byte budget, lean state copies, and a
follow-up that reuses its prompt after other traffic, through the real server.

The server tests read the token counts from the server's own log
(``serving.server_log``), never wall-clock times.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from core.config import Config
from core.model.prompt_cache import NESTED_SLACK, _lean_state_methods, make_prompt_cache_class
from serving.client import LLM
from serving.probe import canary as canary_probe
from serving.server_log import LogTail, Request
from serving.supervisor import ServerSupervisor
from tools import default_registry

PREFIX = tuple(range(100, 400))  # stands for the system prompt and the tool list


def state(n_tokens: int, kv_bytes: int = 1000) -> SimpleNamespace:
    return SimpleNamespace(llama_state_size=kv_bytes, scores=np.zeros((1, 10), np.single),
                           input_ids=np.zeros(16, np.intc), n_tokens=n_tokens)


def held(s: SimpleNamespace) -> int:
    return s.llama_state_size + s.scores.nbytes + s.input_ids.nbytes


# ---------------------------------------------------------------- PromptCache


def test_a_prompt_finds_the_saved_state_with_the_longest_common_prefix():
    cache = make_prompt_cache_class()(capacity_bytes=10**9)
    alpha, beta = state(1), state(2)
    cache[PREFIX + (1, 2, 3) * 5] = alpha
    cache[PREFIX + (7, 8, 9) * 5] = beta
    assert cache[PREFIX + (1, 2, 3) * 5 + (4, 5)] is alpha  # alpha's follow-up
    assert cache[PREFIX + (7, 8)] is beta
    with pytest.raises(KeyError):
        cache[(1, 2)]  # shares no prefix with anything saved
    assert (1, 2) not in cache


def test_a_newer_state_replaces_the_states_it_extends_but_not_other_channels():
    cache = make_prompt_cache_class()(capacity_bytes=10**9)
    choice = PREFIX + (1, 2, 3) * 5 + (50, 51)  # the completion choosing "message:"
    cache[choice] = state(1)
    other = PREFIX + (7, 8, 9) * 5
    cache[other] = state(2)
    # The answer's prompt ends in other tokens for ":\n" than the sampled ":" above.
    answer = choice[:-1] + (52, 53, 60, 61, 62)
    cache[answer] = last = state(3)
    assert list(cache.states) == [other, answer]
    assert cache.cache_size == 2 * held(last)
    assert cache[choice] is last  # the replaced state's prompt is served by the newer one


def test_a_state_diverging_earlier_than_the_slack_is_kept():
    cache = make_prompt_cache_class()(capacity_bytes=10**9)
    first = PREFIX + tuple(range(NESTED_SLACK + 1))
    cache[first] = state(1)
    cache[PREFIX + (999,)] = state(2)
    assert first in cache.states


def test_the_budget_counts_every_byte_held_and_evicts_the_least_recently_used():
    one = held(state(1, kv_bytes=1000))
    cache = make_prompt_cache_class()(capacity_bytes=2 * one)
    a, b, c = PREFIX + (1,) * 20, PREFIX + (2,) * 20, PREFIX + (3,) * 20
    cache[a], cache[b] = state(1, 1000), state(2, 1000)
    cache[a]  # a used again: b is now the least recently used
    cache[c] = state(3, 1000)
    assert list(cache.states) == [a, c]
    assert cache.cache_size == 2 * one <= cache.capacity_bytes


# ---------------------------------------------------------------- lean save/load


@pytest.mark.slow
def test_a_lean_restored_state_continues_exactly_as_the_live_one(served_gguf):
    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp.llama import LlamaState

    save_state, load_state = _lean_state_methods(Llama, LlamaState, llama_cpp, np)
    llm = Llama(str(served_gguf), n_ctx=512, logits_all=False, verbose=False)
    prompt = llm.tokenize(b"<|im_start|>user\nName three colours.<|im_end|>\n"
                          b"<|im_start|>assistant\n", special=True)
    live = llm.create_completion(prompt, max_tokens=12, temperature=0)["choices"][0]["text"]
    saved = save_state(llm)
    assert saved.scores.nbytes < 1 << 20  # not the 96 MiB n_batch x vocab copy
    assert isinstance(saved.llama_state, bytearray)
    llm.create_completion("Something else entirely", max_tokens=4, temperature=0)
    load_state(llm, saved)
    assert llm.n_tokens == saved.n_tokens and llm._requires_eval
    again = llm.create_completion(prompt, max_tokens=12, temperature=0)["choices"][0]["text"]
    assert again == live
    kv = ctypes.c_uint8 * saved.llama_state_size
    assert bytes(kv.from_buffer(saved.llama_state))  # the KV bytes are really there


# ---------------------------------------------------------------- through the server


class CountingLLM(LLM):
    """The real client, counting its HTTP requests (a turn may re-ask with "none")."""

    sent = 0

    async def _complete(self, params: dict):
        self.sent += 1
        return await super()._complete(params)


async def day(config: Config, gguf: Path) -> dict[str, list[Request]]:
    """#alpha first turn, canary, #beta first turn, canary, #alpha follow-up, as the agent
    and the watchdog send them; returns each step's requests from the server's log."""
    tools = default_registry().schemas()[:8]
    system = {"role": "system", "content": config.agent.system_prompt}
    alpha = [system, {"role": "user", "content": "Hello! Who are you?"}]
    beta = [system, {"role": "user", "content": "Hello from another channel."}]
    supervisor = ServerSupervisor(config, gguf=gguf)
    await supervisor.start(watchdog=False)
    steps: dict[str, list[Request]] = {}
    try:
        async with CountingLLM(config, supervisor) as llm:
            log = LogTail(supervisor.log_path)

            async def turn(name: str, messages: list[dict]):
                sent = llm.sent
                reply = await llm.chat(messages, tools=tools, max_tokens=24, temperature=0)
                steps[name] = await log.requests(llm.sent - sent)
                return reply

            async def canary(name: str) -> None:
                assert (await canary_probe(config, supervisor.base_url))[0]
                steps[name] = await log.requests(1)

            first = await turn("alpha first", alpha)
            await canary("canary 1")
            await turn("beta first", beta)
            await canary("canary 2")
            answer = {"role": "assistant", "content": first.content}
            if first.tool_calls:
                answer["tool_calls"] = first.tool_calls
            await turn("alpha follow-up",
                       [*alpha, answer, {"role": "user", "content": "What is 12 + 7?"}])
    finally:
        await supervisor.stop()
    return steps


def config_for(tmp_path: Path, port: int, cache_mb: int) -> Config:
    return Config.model_validate({"paths": {"data_dir": str(tmp_path)},
                                  "server": {"port": port, "prompt_cache_mb": cache_mb}})


@pytest.mark.slow
async def test_a_follow_up_after_a_canary_and_another_channel_reads_only_its_new_tokens(
        tmp_path, served_gguf, free_port):
    steps = await day(config_for(tmp_path, free_port, 1024), served_gguf)
    first = steps["alpha first"][0].prompt
    follow = steps["alpha follow-up"][0].prompt
    other = steps["beta first"][0].prompt
    assert first.reused <= 1 and first.evaluated > 300  # a cold start reads it all
    # The other channel shares the system prompt and tool list: restored, not read again.
    assert other.restored and other.reused >= 0.9 * other.prompt_tokens
    # The canaries and #beta came between; alpha's own state came back from the cache.
    assert follow.restored
    assert follow.reused >= first.prompt_tokens
    assert follow.evaluated <= 0.1 * follow.prompt_tokens


@pytest.mark.slow
async def test_without_the_prompt_cache_the_canary_costs_the_follow_up_its_prefix(
        tmp_path, served_gguf, free_port):
    steps = await day(config_for(tmp_path, free_port, 0), served_gguf)
    follow = steps["alpha follow-up"][0].prompt
    assert not follow.restored
    assert follow.reused <= 1 and follow.evaluated == follow.prompt_tokens - follow.reused
