"""A row with the whole tool registry is trained on: tool calls as actions, tool outputs as
observations, and the harness's own text (the stray probe, the cut notice) as neither."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bot.agent.loop import Agent
from bot.agent.stray import STRAY_CONTINUE, STRAY_QUESTION
from core.config import Config
from tests.test_tokens import HF_DIR, _served_prompt
from tools import default_registry
from trainer import train as T
from trainer.tokens import ACTION, IGNORE, OBSERVATION, render_prompt, render_row

LONG_FILE = "".join(f"line {i}: the quick brown fox\n" for i in range(2000))


def _call(i: int, name: str, arguments: str) -> dict:
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(HF_DIR))


@pytest.fixture(scope="module")
def row() -> dict:
    """An agent turn as the night writes it, with every registered tool offered."""
    config = Config()
    cut = Agent._truncate(SimpleNamespace(config=config), LONG_FILE)  # the agent's own notice
    assert "more characters cut" in cut
    messages = [
        {"role": "system", "content": config.agent.system_prompt},
        {"role": "user", "content": "What does notes.txt say?"},
        {"role": "assistant", "content": None,
         "tool_calls": [_call(1, "read_file", '{"path": "notes.txt"}')]},
        {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": cut},
        {"role": "assistant", "content": "Let me look further."},  # a stray end of turn
        {"role": "user", "content": STRAY_QUESTION},  # probe: harness
        {"role": "assistant", "content": '{"answer": "no"}'},  # probe: harness
        {"role": "user", "content": STRAY_CONTINUE},  # probe: harness
        {"role": "assistant", "content": None,
         "tool_calls": [_call(2, "grep", '{"pattern": "fox", "path": "."}')]},
        {"role": "tool", "tool_call_id": "c2", "name": "grep", "content": "notes.txt:1"},
        {"role": "assistant", "content": "It lists 2000 lines about a quick brown fox."},
    ]
    advantages = [None, None, 0.5, None, -0.2, None, None, None, 0.3, None, 0.4]
    return {"kind": "episode", "episode_id": 1, "split": "train",
            "tools": default_registry().schemas(), "messages": messages,
            "advantages": advantages, "harness": [5, 6, 7],
            "token_overrides": [{"message": 4, "token": -1, "advantage": -1.0}], "labels": []}


def _text(tokenizer, seq, keep) -> str:
    return tokenizer.decode([t for t, k, m in zip(seq.ids, seq.kinds, seq.messages) if keep(k, m)])


def test_the_default_max_tokens_is_the_served_context():
    config = Config()
    assert config.train.max_tokens == 0  # the night passes model.context_tokens
    assert config.model.context_tokens >= 8192 and T.Settings().max_tokens >= 8192


def test_a_full_registry_row_is_kept_with_its_tool_calls_as_actions(row, tokenizer):
    assert len(row["tools"]) >= 40
    context = Config().model.context_tokens
    tools_view, plain_view = render_row(row, tokenizer, max_tokens=context)
    whole = render_row(row, tokenizer)[0]
    assert 2048 < len(tools_view.ids) == len(whole.ids) <= context  # nothing cut
    assert tools_view.advantages == {2: 0.5, 8: 0.3}  # both tool calls are trained
    assert plain_view.advantages == {4: -0.2, 10: 0.4}  # and both text answers
    calls = _text(tokenizer, tools_view, lambda k, m: k == ACTION)
    assert calls == ('functions.read_file:{"path": "notes.txt"}<|im_end|>'
                     'functions.grep:{"pattern": "fox", "path": "."}<|im_end|>')
    seen = _text(tokenizer, tools_view, lambda k, m: k == OBSERVATION)
    assert "What does notes.txt say?" in seen and "line 1999" not in seen
    assert "line 0: the quick brown fox" in seen and "notes.txt:1" in seen
    # Harness text stays in the context but is neither trained nor observed.
    assert "more characters cut" in tokenizer.decode(tools_view.ids)
    assert "more characters cut" not in seen and "Did you mean" not in seen
    for seq in (tools_view, plain_view):
        assert not any(k != IGNORE for k, m in zip(seq.kinds, seq.messages) if m in (5, 6, 7))
    # The examples the trainer builds keep both sequences, with their actions.
    examples = T.build_examples([row], tokenizer, T.Settings(max_tokens=context))
    # tools: the two calls; plain: answer 10, answer 4 and the override on 4's last token
    assert [e.terms for e in examples] == [2, 3]


def test_the_full_registry_prompt_is_the_servers_token_for_token(row, tokenizer, served_gguf):
    import llama_cpp

    messages = row["messages"][:4]
    ours = render_prompt(messages, row["tools"], "auto")
    assert ours == _served_prompt(messages, row["tools"], "auto")
    vocab = llama_cpp.Llama(model_path=str(served_gguf), vocab_only=True, verbose=False)
    ids = tokenizer(ours, add_special_tokens=False)["input_ids"]
    assert vocab.tokenize(ours.encode(), add_bos=True, special=True) == ids
    assert len(ids) > 2048  # the old 2048-token default dropped every such row
