"""The exact context through the real llama.cpp server and the embedded model (issue 9,
part 3): a channel with three earlier turns, then a turn with tool calls and a compaction.
For every assistant step, the prompt the night renders from the store (its prefix, then
the episode's steps) has the token count the server reported in ``usage.prompt_tokens``,
and the training row puts each action right after exactly those tokens."""

from __future__ import annotations

import pytest

from bot.agent.compaction import SUMMARY_PREFIX
from bot.runtime import Runtime
from core.config import Config, NightConfig
from core.storage.store import Store
from trainer.advantages import episode_row
from trainer.context import prefix_refs, sent_messages, with_context
from trainer.tokens import ACTION, render_prompt, render_row


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


class _ServerTokens:
    """Counts tokens as the server does: llama.cpp's own tokenizer of the served GGUF. The
    HF tokenizer the trainer uses splits a run of whitespace before a digit differently
    (``"\\n     1"``, read_file's line numbers: 3 tokens against llama.cpp's 2;
    trainer.tokens, "Simplifications"), so the rendered text is checked here, and the HF
    positions of the training row below."""

    def __init__(self, gguf):
        from llama_cpp import Llama

        from core.model.shim import patch_handlers

        patch_handlers()
        self._llm = Llama(str(gguf), vocab_only=True, verbose=False)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": self._llm.tokenize(text.encode(), add_bos=add_special_tokens,
                                                special=True)}


def served_prompt_tokens(tokenizer, messages: list[dict], tools: list[dict] | None,
                         calls: list[dict], choice: str = "") -> set[int]:
    """What the server's usage can say for one agent ask (see tests/test_tokens.py): under
    ``auto`` the handler completes the prompt once per call (after the calls before it and
    the call's ``functions.NAME:\\n`` head), or once after ``message:\\n`` for a text answer;
    when that text came back empty, serving.client asked again under ``none`` and
    summed both usages. So a text answer has two possible exact counts. A text answer that
    was a bare call head (choice "call_head") was asked again with that tool named, whose
    prompt ends with the call's head: both usages, summed."""
    # A call the model wrote as text (its id "call_text_..."; bot.agent.guards) was a text answer.
    calls = [c for c in calls if not str(c.get("id", "")).startswith("call_text_")]
    if not tools:
        return {_count(tokenizer, render_prompt(messages, None, "none"))}
    ours = render_prompt(messages, tools, "auto")
    if calls and choice == "call_head":
        head = f"functions.{calls[0]['function']['name']}:\n"
        return {_count(tokenizer, ours + "message:\n") + _count(tokenizer, ours + head)}
    if calls:
        total, done = 0, ""
        for c in calls:
            head = f"functions.{c['function']['name']}:\n"
            total += _count(tokenizer, ours + done + head)
            done += head + c["function"]["arguments"] + "\n"
        return {total}
    said = _count(tokenizer, ours + "message:\n")
    return {said, said + _count(tokenizer, render_prompt(messages, tools, "none"))}


@pytest.fixture(scope="module")
def tokenizer(served_gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(served_gguf.parent / "smollm2-135m-instruct-hf"))


@pytest.fixture(scope="module")
def server_tokens(served_gguf):
    return _ServerTokens(served_gguf)


@pytest.mark.slow
async def test_every_steps_rendered_prompt_has_the_servers_prompt_token_count(
        tmp_path, served_gguf, free_port, tokenizer, server_tokens):
    config = Config()
    config.paths.data_dir = tmp_path
    config.model.gguf = served_gguf
    config.model.hf_dir = served_gguf.parent / "smollm2-135m-instruct-hf"
    config.model.context_tokens = 4096
    config.server.port = free_port
    config.agent.tools = ["read_file", "write_file", "list_dir"]
    config.agent.clear_scratch_after_turn = False
    config.agent.temperature = 0
    config.agent.max_steps = 3  # the last step offers no tools (bot.agent.loop)
    config.agent.max_reply_tokens = 48
    config.agent.keep_recent_messages = 2
    rt = await Runtime.start(config)
    try:
        (rt.spaces.context("general").workspace.root / "notes.txt").write_text("milk, eggs\n")
        for text in ("Hello! Who are you?", "List the files in the current directory using list_dir.",
                     "Create a file named todo.txt that contains exactly the word milk."):
            await rt.turn("general", text)
        # The agent's budget only (the server keeps its 4096): the last turn must compact.
        rt.agent.config.model.context_tokens = 512
        await rt.turn("general", "Create a file named shop.txt that contains exactly the word eggs.")
        episodes = await rt.store.episodes_since(0, "general")
        compactions = await rt.store.events("compaction")
    finally:
        await rt.close()
    assert len(episodes) == 4 and compactions
    prefixes = await _prefixes(config.store_path, episodes)
    checked, summarised, calls = 0, 0, 0
    for episode in episodes:
        row, _ = episode_row(episode, "train", {s.id: [1.0] for s in episode.steps}, None,
                             set(), NightConfig())
        rows, why = with_context(row, episode, prefixes)
        assert why is None
        for i, step in enumerate(episode.steps):
            if step.role != "assistant" or (step.meta or {}).get("probe"):
                continue
            ctx = step.meta["context"]
            sent = sent_messages(row, episode, prefixes, i)
            tools = prefixes[ctx["prefix"]]["tools"] if ctx.get("tools", True) else None
            assert step.prompt_tokens in served_prompt_tokens(
                server_tokens, sent, tools, step.tool_calls or [],
                (step.meta or {}).get("choice", ""))
            if not any(c["id"].startswith("call_text_") for c in step.tool_calls or []):
                _assert_row_puts_the_action_after_the_prompt(rows, sent, tools, tokenizer)
            checked += 1
            calls += any(not c["id"].startswith("call_text_") for c in step.tool_calls or [])
            summarised += any(str(m["content"]).startswith(SUMMARY_PREFIX) for m in sent)
    assert checked >= 5 and calls >= 1 and summarised >= 1, (checked, calls, summarised, [
        (s.role, s.content[:80], s.tool_calls) for e in episodes for s in e.steps])
    print(f"checked {checked} assistant steps: {calls} with tool calls made under auto, {summarised} after a "
          f"compaction summary, {len(prefixes)} prefixes")


async def _prefixes(path, episodes) -> dict:
    async with await Store.open(path) as store:
        return await store.prompt_prefixes(prefix_refs(episodes))


def _assert_row_puts_the_action_after_the_prompt(rows, sent, tools, tokenizer):
    """In the training row holding this step as an action, the tokens before the action
    are the prompt the server tokenized (tools view: the row's first action; the plain
    view: every answer)."""
    row = next(r for r in rows if r["messages"][:len(sent)] == sent
               and len(r["messages"]) > len(sent) and r["messages"][len(sent)]["role"] == "assistant"
               and (r["advantages"][len(sent)] is not None))
    for seq in render_row(row, tokenizer):
        positions = seq.action_positions(len(sent))
        if not positions:
            continue
        first_action = min(m for k, m in zip(seq.kinds, seq.messages) if k == ACTION)
        if seq.view == "plain":
            assert positions[0] == _count(tokenizer, render_prompt(sent, tools, "none"))
        elif first_action == len(sent):
            assert positions[0] == _count(tokenizer, render_prompt(sent, tools, "auto"))
