"""A night that imitates holds the live model's own answers to general requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.config import Config
from bot.storage.store import Store
from trainer import sleep
from trainer.anchors import ANCHOR_PROMPTS, anchor_rows, imitates
from trainer.gate import generate_replies
from trainer.gate_items import OPEN_PROMPTS, AgentView
from trainer.tokens import ACTION, render_row

HF_DIR = Path(__file__).parents[1] / "data/models/smollm2-135m-instruct-hf"
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "required": ["path"],
                   "properties": {"path": {"type": "string"}}}}}]
CALL = {"id": "c1", "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}


def test_anchors_are_general_requests_the_gate_does_not_measure_with():
    assert len(set(ANCHOR_PROMPTS)) == len(ANCHOR_PROMPTS) == 16
    assert not set(ANCHOR_PROMPTS) & set(OPEN_PROMPTS)


def test_only_whole_worded_answers_are_held_at_advantage_zero():
    view = AgentView("You are helpful.", TOOLS)
    replies = [{"content": "Hello, I am an assistant.", "finish_reason": "stop"},
               {"content": None, "tool_calls": [CALL]},
               {"content": "  "},
               {"content": "A long answer that was cut", "finish_reason": "length"},
               {"content": "la la la la " * 20},
               {"content": "", "error": "context full"}]
    rows = anchor_rows(ANCHOR_PROMPTS[:6], replies, view)
    assert len(rows) == 1
    [row] = rows
    assert row["kind"] == "anchor" and row["split"] == "train" and row["tools"] == TOOLS
    assert row["messages"] == [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": ANCHOR_PROMPTS[0]},
        {"role": "assistant", "content": "Hello, I am an assistant.", "choice": "message"}]
    assert row["advantages"] == [None, None, 0.0] and row["imitate"] == []
    plain = anchor_rows(ANCHOR_PROMPTS[:1], replies[:1], AgentView("You are helpful."))
    assert "choice" not in plain[0]["messages"][-1]  # no tool list: nothing to choose


def test_an_anchor_is_trained_as_the_model_generated_it():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(HF_DIR))
    [row] = anchor_rows(["Name a colour."], [{"content": "Blue."}], AgentView("Be brief.", TOOLS))
    tools_view, plain_view = render_row(row, tokenizer)

    def actions(seq):
        return tokenizer.decode([i for i, k in zip(seq.ids, seq.kinds) if k == ACTION])

    # Under the tool list the answer is its choices (words, then the end); the words
    # themselves are the plain view's action, as the served model produced them.
    assert actions(tools_view) == "message:<|im_end|>"
    assert actions(plain_view) == "Blue.<|im_end|>"


def test_imitates_only_when_a_train_row_imitates():
    assert imitates([{"split": "train", "imitate": [2]}])
    assert not imitates([{"split": "eval", "imitate": [2]}, {"split": "train", "imitate": []}])


def _dataset(path: Path, imitate: list[int]) -> Path:
    row = {"kind": "episode", "episode_id": 1, "split": "train", "tools": [],
           "messages": [{"role": "user", "content": "What is 2 plus 2?"},
                        {"role": "assistant", "content": "4"}],
           "advantages": [None, None], "imitate": imitate}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row) + "\n")
    return path


async def test_a_night_that_imitates_appends_its_anchors_once(tmp_path, monkeypatch):
    config = Config.model_validate({"paths": {"data_dir": str(tmp_path / "data")},
                                    "night": {"anchors": 3}})
    asked = []

    def replies(gguf, requests, view, chat_format, max_tokens, n_ctx, lora=None):
        asked.append((gguf, lora, list(requests)))
        return [{"content": f"My answer to: {r}"} for r in requests]

    monkeypatch.setattr(sleep, "generate_replies", replies)
    async with await Store.open(config.store_path) as store:
        job = await store.create_job("sleep", {})
        night = sleep.Night(config, store, job)
        dataset = _dataset(tmp_path / "imitates.jsonl", [1])
        await night.anchor(dataset, (Path("live.gguf"), Path("live-lora.gguf")))
        await night.anchor(dataset, (Path("live.gguf"), Path("live-lora.gguf")))  # resumed
        rows = [json.loads(line) for line in dataset.read_text().splitlines()]
        assert asked == [(Path("live.gguf"), Path("live-lora.gguf"), ANCHOR_PROMPTS[:3])]
        assert [r["kind"] for r in rows] == ["episode", "anchor", "anchor", "anchor"]
        assert rows[1]["messages"][-1]["content"] == f"My answer to: {ANCHOR_PROMPTS[0]}"
        assert (await store.job(job))["progress"]["anchors"] == {"asked": 3, "held": 3}

        other = sleep.Night(config, store, await store.create_job("sleep", {}))
        plain = _dataset(tmp_path / "own.jsonl", [])
        await other.anchor(plain, (Path("live.gguf"), None))
        assert len(asked) == 1 and len(plain.read_text().splitlines()) == 1
        assert other.progress["anchors"] == {"asked": 0, "held": 0}


@pytest.mark.slow
def test_the_real_model_gives_anchors_that_tokenize(served_gguf):
    from transformers import AutoTokenizer

    view = AgentView("You are a helpful assistant.")
    requests = ANCHOR_PROMPTS[:3]
    rows = anchor_rows(requests, generate_replies(served_gguf, requests, view, "chatml", 192,
                                                  2048), view)
    assert rows, "the embedded model answered none of three general requests in whole words"
    tokenizer = AutoTokenizer.from_pretrained(str(HF_DIR))
    for row in rows:
        [plain] = render_row(row, tokenizer)
        said = tokenizer.decode([i for i, k in zip(plain.ids, plain.kinds) if k == ACTION])
        assert said == row["messages"][-1]["content"] + "<|im_end|>"
