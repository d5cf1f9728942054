"""The prompt cache of the llama-cpp-python server: saved KV states, found by prefix.

Why: every prompt starts with the same system prompt and tool list (~3,300
tokens with all 40 tools, 15-30 s to read on a 2-core CPU), but the server
keeps the KV state of one prompt only, and any other request (the watchdog's
canary, the "none" re-ask, the stray check, another channel) overwrites it.
With ``--cache``, llama-cpp-python saves the state after each completion and,
before the next one, restores the saved state sharing the longest prefix with
the new prompt, so only the new tokens are read (bench/latency.py).

This module runs in the server process only (``core.model.shim`` calls
``install``) and replaces two parts of llama-cpp-python 0.3.36 there:

- ``llama_cpp.LlamaRAMCache`` (what ``--cache_type ram`` builds) by
  ``PromptCache``, which differs in two ways. A new state replaces the saved
  states it extends (their tokens, but for the last few, are a prefix of its
  own), since restoring it serves their prompts as well: a chat request saves
  two or three nested states, one per completion, and only the longest is
  worth keeping. And the size it is given bounds everything it holds, the
  token ids and logits included; LlamaRAMCache counts the KV bytes only.
- ``Llama.save_state``/``load_state``, when the model keeps no logits
  (``logits_all`` false, which ``serving.kinds`` passes): llama-cpp-python
  then never writes or reads its logits array (sampling reads the context's
  own logits), yet the stock pair copies its n_batch x vocab floats (96 MiB
  for SmolLM2) on every save and clears it on every load, and copies the KV
  bytes twice more than needed. Measured here at 1,500 tokens: save 250 ->
  70 ms, load 150 -> 25 ms. A restored state is always read again from at
  least its last token (``load_state`` sets ``_requires_eval``), so no
  sampled token ever depends on logits it did not compute.

Nothing else changes: the server's lookup, eviction order (least recently
used) and HTTP API are llama-cpp-python's.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from typing import Sequence

# A saved state is replaced by a newer one sharing all its tokens but at most this many:
# a completion's sampled ":" and the next prompt's ":\n" tokenise differently, so the
# states of one request are nested but for their last token or two. A prompt that would
# have matched the dropped state to its end reads at most this many tokens more.
NESTED_SLACK = 8


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _state_bytes(state) -> int:
    return int(state.llama_state_size) + state.scores.nbytes + state.input_ids.nbytes


def make_prompt_cache_class():
    """The cache class, built on llama_cpp's base class (imported only in the server)."""
    from llama_cpp.llama_cache import BaseLlamaCache

    class PromptCache(BaseLlamaCache):
        """Saved states by token prefix, least recently used first out, within a byte budget."""

        def __init__(self, capacity_bytes: int = 2 << 30) -> None:
            super().__init__(capacity_bytes)
            self.states: OrderedDict[tuple[int, ...], object] = OrderedDict()
            self.held = 0

        @property
        def cache_size(self) -> int:
            return self.held

        def _find_longest_prefix_key(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
            best, best_len = None, 0
            for saved in self.states:
                n = _common_prefix(saved, key)
                if n > best_len:
                    best, best_len = saved, n
            return best

        def __getitem__(self, key: Sequence[int]):
            found = self._find_longest_prefix_key(tuple(key))
            if found is None:
                raise KeyError("no saved state shares a prefix with this prompt")
            self.states.move_to_end(found)
            return self.states[found]

        def __contains__(self, key: Sequence[int]) -> bool:
            return self._find_longest_prefix_key(tuple(key)) is not None

        def __setitem__(self, key: Sequence[int], state) -> None:
            key = tuple(key)
            for saved in list(self.states):
                if _common_prefix(saved, key) >= len(saved) - NESTED_SLACK:
                    self._drop(saved)  # the new state serves its prompts too (see above)
            self.states[key] = state
            self.held += _state_bytes(state)
            while self.held > self.capacity_bytes and self.states:
                self._drop(next(iter(self.states)))

        def _drop(self, key: tuple[int, ...]) -> None:
            self.held -= _state_bytes(self.states.pop(key))

    return PromptCache


def _lean_state_methods(Llama, LlamaState, llama_cpp_lib, np):
    """save_state/load_state that skip the unused logits copy when logits_all is off."""
    stock_save, stock_load = Llama.save_state, Llama.load_state

    def save_state(self):
        if self._logits_all:
            return stock_save(self)
        ctx = self._ctx.ctx
        size = llama_cpp_lib.llama_state_get_size(ctx)
        buffer = bytearray(size)  # writable, so load_state maps it without a copy; picklable
        n_bytes = llama_cpp_lib.llama_state_get_data(
            ctx, (ctypes.c_uint8 * size).from_buffer(buffer), size)
        if n_bytes > size:
            raise RuntimeError("Failed to copy llama state data")
        return LlamaState(
            scores=np.zeros((1, self._n_vocab), dtype=np.single),  # never read; see above
            input_ids=self.input_ids.copy(),
            n_tokens=self.n_tokens,
            llama_state=buffer,
            llama_state_size=n_bytes,
            seed=self._seed,
        )

    def load_state(self, state) -> None:
        if self._logits_all or not isinstance(state.llama_state, bytearray):
            return stock_load(self, state)
        self.input_ids = state.input_ids.copy()
        self.n_tokens = state.n_tokens
        self._requires_eval = True  # generate() reads at least the last token again
        self._seed = state.seed
        size = state.llama_state_size
        view = (ctypes.c_uint8 * size).from_buffer(state.llama_state)
        if llama_cpp_lib.llama_state_set_data(self._ctx.ctx, view, size) != size:
            raise RuntimeError("Failed to set llama state data")

    return save_state, load_state


def install() -> None:
    """Put PromptCache and the lean state methods in place (idempotent; server process only)."""
    import llama_cpp
    import numpy as np
    from llama_cpp.llama import Llama, LlamaState

    if getattr(Llama, "_nightshift_lean_states", False):
        return
    llama_cpp.LlamaRAMCache = make_prompt_cache_class()
    Llama.save_state, Llama.load_state = _lean_state_methods(Llama, LlamaState, llama_cpp, np)
    Llama._nightshift_lean_states = True
