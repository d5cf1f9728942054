"""The function-calling handler's choice between words and a call is made on whole
options (core.model.choice): greedy decoding under the handler's grammar compared
first tokens only and chose ``functions.read_file`` for "What is 22 minus 13?" though
the model gives ``message:`` most of the options' probability; and it was greedy at
every temperature, so practice never explored the choice."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from core.model.choice import options_of, pick, score
from core.model.shim import patch_handlers
from core.model.wire import FUNCTION_CALLING

TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name.replace('_', ' ')} in the workspace",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}} for name in ("read_file", "write_file", "list_dir")]
ARITHMETIC = [{"role": "system", "content": "You are a helpful assistant with tools."},
              {"role": "user", "content": "What is 22 minus 13? Answer with only the number."}]


def _grammar(text: str):
    from llama_cpp.llama_grammar import LlamaGrammar

    return LlamaGrammar.from_string(text, verbose=False)


def test_the_choice_grammar_is_recognised_and_its_options_read():
    # The handler's own first grammar under "auto" (llama-cpp-python 0.3.36).
    choice = _grammar('root   ::= functions | "message:"\n'
                      'functions ::= "functions.read_file:" | "functions.list_dir:"\n')
    assert options_of(choice) == ["message:", "functions.read_file:", "functions.list_dir:"]
    # Its follow-up grammar after a call, an argument's grammar, no grammar: not the choice.
    follow_up = _grammar('root   ::= functions | "<|im_end|>"\nfunctions ::= "functions.x:"\n')
    assert options_of(follow_up) is None
    assert options_of(_grammar('root ::= "a" | "b"\n')) is None
    assert options_of(None) is None


def test_pick_is_the_argmax_at_temperature_zero():
    assert pick([-11.3, -14.6, -16.4], 0.0, random.Random(0)) == 0
    assert pick([-9.0, -6.3, -6.3], 0.0, random.Random(0)) == 1  # a tie goes to the first


def test_pick_samples_the_tempered_probabilities():
    logprobs = [np.log(0.6), np.log(0.3), np.log(0.1)]
    rng = random.Random(7)
    counts = Counter(pick(logprobs, 1.0, rng) for _ in range(20_000))
    assert [round(counts[i] / 20_000, 2) for i in range(3)] == pytest.approx([0.6, 0.3, 0.1],
                                                                            abs=0.02)
    # At T = 0.5 the weights are p^2, renormalised: 0.36 : 0.09 : 0.01.
    counts = Counter(pick(logprobs, 0.5, rng) for _ in range(20_000))
    assert counts[0] / 20_000 == pytest.approx(0.36 / 0.46, abs=0.02)


@pytest.mark.slow
def test_whole_option_scores_match_the_models_own_log_probs(served_gguf):
    """Each option's score is the sum of the model's log-probs of its tokens after the
    prompt, computed here again from scratch with every position's logits kept."""
    from llama_cpp import Llama

    from trainer.tokens import render_prompt

    patch_handlers()
    prompt = render_prompt(ARITHMETIC, TOOLS, "auto")
    options = ["message:"] + [f"functions.{t['function']['name']}:" for t in TOOLS]
    llm = Llama(model_path=str(served_gguf), n_ctx=2048, verbose=False, seed=0)
    _, scores = score(llm, prompt, options)
    full = Llama(model_path=str(served_gguf), n_ctx=2048, verbose=False, seed=0,
                 logits_all=True)
    head = full.tokenize(prompt.encode(), add_bos=False, special=True)
    expected = []
    for option in options:
        tail = full.tokenize(option.encode(), add_bos=False, special=False)
        full.reset()
        full.eval(head + tail)
        logits = np.asarray(full.scores[len(head) - 1: len(head) + len(tail) - 1], dtype=np.float64)
        logp = logits - logits.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        expected.append(sum(logp[i, t] for i, t in enumerate(tail)))
    # Decoded one token at a time rather than in one batch, q8_0's activations round
    # differently through 30 layers: up to ~0.05 nats here. The options are nats apart.
    assert scores == pytest.approx(expected, abs=0.2)
    assert np.argsort(scores).tolist() == np.argsort(expected).tolist()


@pytest.mark.slow
def test_the_served_handler_answers_arithmetic_in_words_and_explores_at_temperature(served_gguf):
    """Through the patched handler, as the server and the gate run it: greedy, the
    choice is the best whole option (words for arithmetic; the stock handler chose
    read_file); at temperature 1.5 a creation request samples more than one branch."""
    from llama_cpp import Llama

    from trainer.tokens import render_prompt

    patch_handlers()
    llm = Llama(model_path=str(served_gguf), n_ctx=2048, chat_format=FUNCTION_CALLING,
                verbose=False, seed=0)
    options = ["message:"] + [f"functions.{t['function']['name']}:" for t in TOOLS]
    _, scores = score(llm, render_prompt(ARITHMETIC, TOOLS, "auto"), options)
    assert scores.index(max(scores)) == 0, scores
    reply = llm.create_chat_completion(messages=ARITHMETIC, tools=TOOLS, tool_choice="auto",
                                       temperature=0, max_tokens=32)
    assert not reply["choices"][0]["message"].get("tool_calls"), reply

    create = [ARITHMETIC[0], {"role": "user", "content": "Create a file named lemon.txt that "
                                                         "contains exactly the word river."}]
    branches = set()
    for seed in range(8):
        reply = llm.create_chat_completion(messages=create, tools=TOOLS, tool_choice="auto",
                                           temperature=1.5, max_tokens=24, seed=seed)
        calls = reply["choices"][0]["message"].get("tool_calls") or []
        branches.add(calls[0]["function"]["name"] if calls else "message")
    assert len(branches) >= 2, branches


@pytest.mark.slow
def test_the_search_stops_early_and_keeps_the_choice_with_every_tool(served_gguf):
    """Best first, with log π only falling along a path: at slack 0 the argmax is found
    with far fewer decodes than scoring every option; with a slack, every option within
    it is scored exactly and the ones left out are below it."""
    from llama_cpp import Llama

    from tools import default_registry
    from trainer.tokens import render_prompt

    patch_handlers()
    schemas = default_registry().schemas()
    options = ["message:"] + [f"functions.{t['function']['name']}:" for t in schemas]
    llm = Llama(model_path=str(served_gguf), n_ctx=8192, verbose=False, seed=0)
    decodes = Counter()
    inner_eval = llm.eval

    def counting_eval(tokens):
        decodes["n"] += 1
        return inner_eval(tokens)

    llm.eval = counting_eval
    for messages in (ARITHMETIC,):  # one prompt: reading 3,500 tokens takes ~30 s here
        prompt = render_prompt(messages, schemas, "auto")
        decodes.clear()
        _, full = score(llm, prompt, options)
        every = decodes["n"]
        decodes.clear()
        _, greedy = score(llm, prompt, options, slack=0.0)
        assert greedy.index(max(greedy)) == full.index(max(full))
        # Decoded along other paths, q8_0 rounds a little differently (see above).
        assert max(greedy) == pytest.approx(max(full), abs=0.2)
        assert decodes["n"] < every / 3, (decodes["n"], every)
        _, near = score(llm, prompt, options, slack=5.0)
        for kept, exact in zip(near, full):
            assert (kept == -np.inf and exact < max(full) - 4.8
                    or kept == pytest.approx(exact, abs=0.2))


@pytest.mark.slow
def test_a_named_tool_gets_its_arguments_under_its_schema(served_gguf):
    """What the client asks when the model's words were a bare ``functions.NAME:``
    (core.model.wire.call_head): through the patched handler, the named tool's call
    with every required argument, as its schema's grammar writes them."""
    import json

    from llama_cpp import Llama

    patch_handlers()
    llm = Llama(model_path=str(served_gguf), n_ctx=2048, chat_format=FUNCTION_CALLING,
                verbose=False, seed=0)
    tools = [{"type": "function", "function": {
        "name": "write_file", "description": "Create or overwrite a text file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                        "content": {"type": "string"}},
                       "required": ["path", "content"], "additionalProperties": False}}},
        *TOOLS[:1]]
    messages = [ARITHMETIC[0], {"role": "user", "content": "Create a file named lemon.txt "
                                                           "that contains the word planet."}]
    reply = llm.create_chat_completion(
        messages=messages, tools=tools, temperature=0, max_tokens=48,
        tool_choice={"type": "function", "function": {"name": "write_file"}})
    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "write_file"
    assert set(json.loads(call["arguments"])) == {"path", "content"}
