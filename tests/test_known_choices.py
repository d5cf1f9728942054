"""train.imitate_known_choices: a reference's choice under the tool list that most of its
group's attempts made too is left out of the imitation (trainer.examples)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trainer.examples import build_examples, known_choices
from trainer.settings import Settings

HF_DIR = Path(__file__).parents[1] / "data/models/smollm2-135m-instruct-hf"
TOOLS = [{"type": "function", "function": {
    "name": "write_file", "description": "Write a file.",
    "parameters": {"type": "object", "required": ["path"],
                   "properties": {"path": {"type": "string"}}}}}]
PROMPT = [{"role": "system", "content": "You are helpful."},
          {"role": "user", "content": "What is 3 times 9? Answer with only the number."}]
WORDS = {"role": "assistant", "content": "3 times 9 is 27.", "choice": "message"}
REFERENCE_WORDS = {"role": "assistant", "content": "27", "choice": "message"}


def _call(path: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": "c", "type": "function",
        "function": {"name": "write_file", "arguments": f'{{"path": "{path}"}}'}}]}


def _attempt(answer: dict, group: str = "g:1", episode: int = 1, **extra) -> dict:
    return {"kind": "episode", "episode_id": episode, "split": "train", "tools": TOOLS,
            "messages": [*PROMPT, answer], "advantages": [None, None, 0.0], "imitate": [],
            "token_overrides": [], "labels": [], "group": group, "context": 1,
            "prefix_messages": 1, "reward_source": {"check": "exact"}, **extra}


def _reference(answer: dict, group: str = "g:1") -> dict:
    return {**_attempt(answer, group, 99), "advantages": [None, None, None], "imitate": [2],
            "reward_source": {"check": "reference"}}


def test_a_choice_most_attempts_made_is_known_and_one_they_did_not_is_taught():
    words = [_attempt(WORDS, episode=i) for i in range(3)] + [_attempt(_call("x"), episode=3)]
    rows = [*words, _reference(REFERENCE_WORDS)]
    assert known_choices(rows) == {4: {2}}  # 3 of 4 answered in words, as the reference does
    calls = [_attempt(_call("x"), episode=i) for i in range(2)] + words[:2]
    assert known_choices([*calls, _reference(REFERENCE_WORDS)]) == {}  # 2 of 4: no majority
    # A call's choice is its tool: the reference's write_file is known where most called it.
    tool_rows = [_attempt(_call("a"), "t:1", i) for i in range(3)]
    assert known_choices([*tool_rows, _reference(_call("b"), "t:1")]) == {3: {2}}
    # No attempts, another group's attempts, or a reference that imitates something else.
    assert known_choices([_reference(REFERENCE_WORDS)]) == {}
    assert known_choices([*words, _reference(REFERENCE_WORDS, "other:1")]) == {}
    assert known_choices([*words, {**_reference(REFERENCE_WORDS), "imitate": []}]) == {}


def test_text_that_was_no_choice_of_words_votes_for_no_choice():
    """A bare call head left as text, or failed call syntax: the model reached for a tool,
    so the text has no ``choice`` and must not count as answering in words."""
    bare = {"role": "assistant", "content": "functions.write_file:"}
    rows = [*(_attempt(bare, episode=i) for i in range(2)), _attempt(WORDS, episode=2),
            _reference(REFERENCE_WORDS)]
    assert known_choices(rows) == {}  # 1 of 3 chose words


def test_a_row_that_continues_after_a_compaction_tells_nothing_of_the_first_choice():
    later = [_attempt(_call("x"), episode=i, context=2) for i in range(3)]  # not a first action
    words = [_attempt(WORDS, episode=9)]
    assert known_choices([*later, *words, _reference(REFERENCE_WORDS)]) == {4: {2}}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(HF_DIR))


def test_the_known_choice_leaves_the_imitation_and_the_words_stay(tokenizer):
    rows = [*(_attempt(WORDS, episode=i) for i in range(3)), _reference(REFERENCE_WORDS)]
    settings = Settings(max_tokens=2048, imitate_known_choices=True)
    assert not Settings().imitate_known_choices  # the default leaves known choices out

    def demonstrated(examples) -> list[str]:
        return [tokenizer.decode(e.ids[e.demo]) for e in examples if bool(e.demo.any())]

    assert demonstrated(build_examples(rows, tokenizer, settings)) == [
        "message:<|im_end|>", "27<|im_end|>"]  # the tools view's choices, the plain view's words
    off = replace(settings, imitate_known_choices=False)
    assert demonstrated(build_examples(rows, tokenizer, off)) == ["27<|im_end|>"]
    # The attempts' own training is untouched: the same OAPL targets either way.
    for a, b in zip(build_examples(rows, tokenizer, settings), build_examples(rows, tokenizer, off),
                    strict=True):
        assert a.terms == b.terms and a.msg.equal(b.msg) and a.adv.equal(b.adv)
    # Without a majority the choice is taught: 2 of 4 attempts called a tool.
    split = [_attempt(_call("x"), episode=i) for i in range(2)] + rows[:2]
    assert demonstrated(build_examples([*split, rows[-1]], tokenizer, off)) == [
        "message:<|im_end|>", "27<|im_end|>"]


def test_only_the_first_choice_is_known_the_answer_after_a_call_keeps_its_choice(tokenizer):
    """A tool reference calls, reads the result, then answers in words: most attempts
    called the same tool first, so that call's name leaves the imitation; its arguments, and
    the later choice to answer in words after the result, stay."""
    result = {"role": "tool", "tool_call_id": "c", "name": "write_file", "content": "written"}
    done = {"role": "assistant", "content": "Done.", "choice": "message"}
    reference = {**_reference(_call("b"), "t:1"), "advantages": [None] * 5, "imitate": [2, 4]}
    reference["messages"] = [*reference["messages"], result, done]
    rows = [*(_attempt(_call("a"), "t:1", i) for i in range(3)), reference]
    off = Settings(max_tokens=2048, imitate_known_choices=False)
    tools_view = next(e for e in build_examples(rows, tokenizer, off)
                      if bool(e.demo.any()) and bool(e.head.any()))
    assert tokenizer.decode(tools_view.ids[tools_view.demo]) == (
        '{"path": "b"}<|im_end|>message:<|im_end|>')


def test_a_known_call_keeps_its_arguments_imitated(tokenizer):
    rows = [*(_attempt(_call("a"), "t:1", i) for i in range(3)), _reference(_call("b"), "t:1")]
    off = Settings(max_tokens=2048, imitate_known_choices=False)
    (shown,) = [tokenizer.decode(e.ids[e.demo]) for e in build_examples(rows, tokenizer, off)
                if bool(e.demo.any())]
    assert shown == '{"path": "b"}<|im_end|>'  # the tool's name, its choice, is not imitated


def _passing(answer: dict, group: str = "g:1", episode: int = 7) -> dict:
    return {**_attempt(answer, group, episode), "advantages": [None, None, 0.5], "imitate": [2]}


def test_a_passing_attempts_choice_is_known_only_where_asked_and_most_of_its_group_made_it():
    rows = [*(_attempt(WORDS, episode=i) for i in range(2)), _passing(WORDS)]
    assert known_choices(rows) == {}  # references only, as before
    assert known_choices(rows, passing=True) == {2: {2}}  # 3 of 3 answered in words
    assert known_choices(rows, references=False, passing=True) == {2: {2}}
    # A call that passed where the others answered in words shows a choice: it stays taught.
    odd = [*(_attempt(WORDS, episode=i) for i in range(3)), _passing(_call("x"))]
    assert known_choices(odd, passing=True) == {}
    # An attempt that is not imitated is no demonstration, whatever it chose.
    assert known_choices([*rows[:2], _attempt(WORDS, episode=5)], passing=True) == {}


def test_a_passing_attempts_known_choice_leaves_the_imitation_and_its_oapl_stays(tokenizer):
    rows = [*(_attempt(WORDS, episode=i) for i in range(3)), _passing(WORDS)]
    off = Settings(max_tokens=2048)
    assert not off.imitate_known_passing_choices  # the default leaves it out
    on = replace(off, imitate_known_passing_choices=True)

    def demonstrated(examples) -> list[str]:
        return [tokenizer.decode(e.ids[e.demo]) for e in examples if bool(e.demo.any())]

    assert demonstrated(build_examples(rows, tokenizer, on)) == [
        "message:<|im_end|>", "3 times 9 is 27.<|im_end|>"]
    assert demonstrated(build_examples(rows, tokenizer, off)) == ["3 times 9 is 27.<|im_end|>"]
    for a, b in zip(build_examples(rows, tokenizer, on), build_examples(rows, tokenizer, off),
                    strict=True):
        assert a.terms == b.terms and a.msg.equal(b.msg) and a.adv.equal(b.adv)
