"""The function-calling handler's choice between words and a call, made on whole options.

Why: under ``tool_choice="auto"``, llama-cpp-python 0.3.36's
``chatml-function-calling`` handler chooses between ``message:`` and each
``functions.NAME:`` by one grammar-constrained completion, greedy whatever the
request's temperature. Greedy decoding under a grammar compares the options' first
tokens only, and ``function`` is a common English token where ``message`` is not.
So the embedded model "chose" ``functions.read_file`` for "What is 22 minus 13?
Answer with only the number." while, scored as wholes, it gives ``message:`` 0.95 of
the options' probability (0.76-0.95 on every such prompt measured; ``read_file``
0.04): the "always calls a tool" of the first-contact trials and of practice. And a
choice fixed at temperature 0 never explores, so practice at temperature 0.8 sampled
the same branch four times out of four and the night had nothing to compare.

What this does instead: each option's tokens are scored after the prompt, log π of
the whole option (each option tokenized on its own, as ``trainer.tokens`` renders
it as an action), and the choice is the most probable option at temperature 0, or a
sample from π(option)^(1/T) renormalised over the options at temperature T. So what
the night trains, the log-probability of ``message:`` or ``functions.NAME:``, is
exactly what decides the choice the next day.

Cost: the prompt is read by an ordinary one-token completion (so the prompt cache
and the kept state work as for any request), then one decode per inner node of the
options' token trie that the search reaches: it goes best first and stops once what
is left is ``SLACK_NATS`` x T below the best whole option (at T = 0, at the argmax),
since log π only falls along a path. Scoring every node was about ten one-token
decodes with the default three tools and about a hundred with all 42, ~4 s a call
on the 2-core CPU (bench/latency.py).
"""

from __future__ import annotations

import heapq
import math
import random
import re
from typing import Any

import numpy as np

# Options further than this (times the temperature) below the best are not scored.
SLACK_NATS = 20.0
# The handler's first grammar under "auto": root ::= functions | "message:".
CHOICE_GRAMMAR = re.compile(r'^root\s*::=\s*functions\s*\|\s*"message:"')
_LITERAL = re.compile(r'"([^"\\]+)"')


def options_of(grammar: Any) -> list[str] | None:
    """The literal options of the handler's choice grammar, or None for any other
    completion (whose grammar is not that one)."""
    text = getattr(grammar, "_grammar", None)
    if not isinstance(text, str) or not CHOICE_GRAMMAR.match(text):
        return None
    return list(dict.fromkeys(_LITERAL.findall(text)))


def pick(logprobs: list[float], temperature: float, rng: random.Random) -> int:
    """The index of the option chosen: the argmax at temperature 0, else a sample from
    the options' probabilities to the power 1/T, renormalised (pure; tested)."""
    if temperature <= 0:
        return max(range(len(logprobs)), key=lambda i: (logprobs[i], -i))
    top = max(logprobs)
    weights = [math.exp((lp - top) / temperature) for lp in logprobs]
    return rng.choices(range(len(logprobs)), weights=weights)[0]


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def _next_logprobs(llama: Any) -> np.ndarray:
    """log π of the next token after what the context last decoded."""
    from llama_cpp import llama_cpp

    row = llama_cpp.llama_get_logits_ith(llama._ctx.ctx, -1)
    return _log_softmax(np.ctypeslib.as_array(row, shape=(llama.n_vocab(),)).astype(np.float64))


def score(llama: Any, prompt: str, options: list[str], slack: float = math.inf
          ) -> tuple[dict, list[float]]:
    """(the prompt's one-token completion, log π of each option after ``prompt``).

    The completion reads the prompt as any request does (prefix reuse, prompt cache);
    with one token to generate it stops before decoding it, so the context's logits are
    the prompt's last position. Then the options' token trie is searched best first: a
    node's log π (the sum over its tokens) only falls as tokens are added, so once the
    best remaining node is more than ``slack`` nats below the best whole option found,
    nothing left can come closer, and the options not reached get -inf. ``slack`` 0
    finds the argmax alone; infinite slack scores every option exactly (every inner
    node decoded once)."""
    head = llama.create_completion(prompt=prompt, max_tokens=1, temperature=0.0, stream=False)
    base = llama.n_tokens
    tokens = [tuple(llama.tokenize(o.encode(), add_bos=False, special=False)) for o in options]
    children: dict[tuple[int, ...], set[int]] = {}
    ends: dict[tuple[int, ...], list[int]] = {}  # node -> the options that end there
    for i, toks in enumerate(tokens):
        ends.setdefault(toks, []).append(i)
        for depth in range(len(toks)):
            children.setdefault(toks[:depth], set()).add(toks[depth])
    logprobs = [-math.inf] * len(options)
    state: tuple[int, ...] = ()  # the option tokens decoded after the prompt now
    frontier: list[tuple[float, tuple[int, ...]]] = []  # (-log π, node)
    best = -math.inf

    def expand(node: tuple[int, ...], partial: float, next_logprobs: np.ndarray) -> None:
        for token in children.get(node, ()):
            heapq.heappush(frontier, (-(partial + float(next_logprobs[token])), node + (token,)))

    expand((), 0.0, _next_logprobs(llama))
    while frontier:
        negative, node = heapq.heappop(frontier)
        partial = -negative
        if partial < best - slack:
            break  # every node left is at least this far below: no option left comes closer
        for i in ends.get(node, ()):
            logprobs[i] = partial
            best = max(best, partial)
        if node in children:
            common = next((i for i, (a, b) in enumerate(zip(state, node)) if a != b),
                          min(len(state), len(node)))
            llama.n_tokens = base + common  # eval drops the cache past n_tokens
            llama.eval(list(node[common:]))
            state = node
            expand(node, partial, _next_logprobs(llama))
    return head, logprobs


def choose(llama: Any, prompt: str, grammar: Any, temperature: float,
           rng: random.Random) -> dict | None:
    """The handler's choice completion, made on whole options: a completion response
    whose text is the option chosen without its ``:`` (the handler's stop), or None
    when ``grammar`` is not the choice grammar."""
    options = options_of(grammar)
    if not options:
        return None
    # At temperature T an option SLACK_NATS * T below the best weighs e^-SLACK_NATS of it
    # in π^(1/T): left unscored, the choice's distribution moves by less than that.
    head, logprobs = score(llama, prompt, options, slack=SLACK_NATS * max(temperature, 0.0))
    chosen = options[pick(logprobs, temperature, rng)]
    choice = dict(head["choices"][0], text=chosen.removesuffix(":"), finish_reason="stop")
    return {**head, "choices": [choice]}
