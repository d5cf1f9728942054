"""A step's model side: every token's log-prob, and micro-batches that share a prompt.

``Policy`` runs the decoder to hidden states and ``TargetLogProb`` applies the
frozen lm_head and log-softmax per chunk of positions, so no ``[seq, vocab]``
logits tensor is ever built (``trainer.train`` has the memory argument).
Rows that begin with the same prompt (a night's rows all start with the system
prompt and tool list the model was sent) are put in one micro-batch
(``micro_batches``), and ``Policy`` computes that prompt once for them.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import nn


class _Row(Protocol):
    ids: torch.Tensor  # (T,) long


E = TypeVar("E", bound=_Row)


class TargetLogProb(torch.autograd.Function):
    """log softmax(h W^T)[y] per chunk of rows; W (the lm_head) must be frozen."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk):  # (N, D), (V, D), (N,), int
        logp = hidden.new_empty(hidden.shape[0], dtype=torch.float32)  # (N,)
        direction = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None  # (N, D)
        w = weight.to(hidden.dtype)
        for start in range(0, hidden.shape[0], chunk):
            h, y = hidden[start:start + chunk], targets[start:start + chunk]  # (C, D), (C,)
            logits = (h @ w.T).float()  # (C, V): the only vocabulary-sized tensor
            lse = torch.logsumexp(logits, dim=-1)  # (C,)
            logp[start:start + chunk] = logits.gather(1, y[:, None])[:, 0] - lse
            if direction is not None:
                probs = logits.sub_(lse[:, None]).exp_()  # (C, V), in place
                direction[start:start + chunk] = w[y] - (probs @ w.float()).to(w.dtype)  # (C, D)
        ctx.save_for_backward(direction if direction is not None else hidden.new_empty(0))
        return logp

    @staticmethod
    def backward(ctx, grad):  # grad: (N,)
        (direction,) = ctx.saved_tensors
        return grad[:, None].to(direction.dtype) * direction, None, None, None


class Policy(nn.Module):
    """Token log-probs of the LoRA model; one module, so accelerate can wrap it."""

    def __init__(self, model: Any, chunk: int, compute_dtype: str = "float32") -> None:
        super().__init__()
        if compute_dtype not in ("float32", "bfloat16"):  # "auto" is resolved before this
            raise ValueError(f"compute_dtype {compute_dtype!r}: float32 or bfloat16")
        self.model, self.chunk = model, chunk
        self.shares = sharing(model)  # whether a shared prompt can be computed once
        # bfloat16: the decoder's matrix products under autocast. The weights, the LoRA and
        # its gradients stay float32, and so does the residual stream (a float32 embedding
        # plus bfloat16 sublayer outputs promotes to float32); the head and log-softmax run
        # on float32 hidden states, so log-probs keep their precision.
        self.bf16 = compute_dtype == "bfloat16"

    def _decoder(self, device: torch.device):
        # float32 leaves any autocast of the caller's alone (accelerate's mixed precision).
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=torch.bfloat16)

    def forward(self, ids: torch.Tensor, shared: int = 0,
                need: torch.Tensor | None = None) -> torch.Tensor:  # (B, T) -> (B, T)
        """Each token's log-prob given the ones before it (0 for the first token).

        ``shared``: the rows' first ``shared`` tokens are the same (a prompt prefix). They
        are computed once, on one row, and their keys and values serve every row: the same
        log-probs and gradients as the full batch (the gradient of the expanded prefix sums
        over the rows), for a fraction of the compute when the prefix is most of a row.

        ``need``: (B, T) bool, the positions whose log-prob a loss reads; the others are 0.
        The head (vocabulary-sized) is then applied to those positions alone: a night's rows
        are mostly prompt, which no loss reads, and the head is about a fifth of the model's
        compute per position (576 x 49,152 of SmolLM2's ~135M)."""
        core = self.model.get_base_model()
        if core.lm_head.weight.requires_grad or core.lm_head.bias is not None:
            raise ValueError("the chunked log-prob needs a frozen lm_head without bias")
        b, t = ids.shape
        if need is None:
            need = torch.ones_like(ids, dtype=torch.bool)
        need = need.clone()
        need[:, 0] = False  # the first token has no context to be predicted from
        if shared < 1 or b < 2 or not self.shares:
            with self._decoder(ids.device):
                hidden = core.model(input_ids=ids, use_cache=False).last_hidden_state  # (B, T, D)
            hidden = hidden.float()
            # Position t-1's hidden state predicts token t.
            return self._gather(hidden[:, :-1], ids[:, 1:], need[:, 1:], pad=1)
        from transformers import DynamicCache

        cache = DynamicCache(config=core.config)
        with self._decoder(ids.device):
            head = core.model(input_ids=ids[:1, :shared], cache=cache,
                              use_cache=True).last_hidden_state  # (1, S, D)
            if cache.get_seq_length() != shared:  # not filled: sharing would be wrong
                raise RuntimeError(f"the model did not keep the prompt's {shared} tokens in "
                                   "its cache; set train.micro_batch = 1 to compute rows whole")
            cache.batch_repeat_interleave(b)
            tail = core.model(input_ids=ids[:, shared:], cache=cache,
                              use_cache=True).last_hidden_state  # (B, T-S, D)
        head, tail = head.float(), tail.float()
        # The prefix's log-probs are the same for every row: computed once, where any row
        # needs them.
        head_logp = self._gather(head[:, :-1], ids[:1, 1:shared],
                                 need[:, 1:shared].any(dim=0, keepdim=True), pad=1)  # (1, S)
        # Position S-1 (the prefix's last) predicts each row's first own token.
        tail_in = torch.cat([head[:, -1:].expand(b, 1, head.shape[-1]), tail[:, :-1]], dim=1)
        tail_logp = self._gather(tail_in, ids[:, shared:], need[:, shared:], pad=0)  # (B, T-S)
        return torch.cat([head_logp.expand(b, -1), tail_logp], dim=1)

    def _gather(self, hidden: torch.Tensor, targets: torch.Tensor, need: torch.Tensor,
                pad: int) -> torch.Tensor:
        """(R, L, D) hidden states, (R, L) targets and need -> (R, pad + L) log-probs,
        ``pad`` zeros first, 0 where not needed."""
        weight = self.model.get_base_model().lm_head.weight
        # With bfloat16 the head stays float32 under any autocast; float32 leaves it be.
        float32_head = (torch.autocast(hidden.device.type, enabled=False) if self.bf16
                        else contextlib.nullcontext())
        with float32_head:
            picked = TargetLogProb.apply(hidden[need], weight, targets[need], self.chunk)  # (N,)
        out = picked.new_zeros(need.shape).masked_scatter(need, picked)  # (R, L)
        return F.pad(out, (pad, 0))


def sharing(model: Any) -> bool:
    """Whether ``Policy`` may compute a shared prompt once for ``model``: its cache must
    hold plain keys and values per layer (not a hybrid model's recurrent state), and no
    activation checkpointing may be on (transformers then drops the cache, and a replayed
    forward would write into it twice)."""
    from transformers import DynamicCache

    core = model.get_base_model()
    if core.is_activation_checkpointing or any(
            type(m).__name__ == "CheckpointWrapper" for m in core.modules()):
        return False
    try:
        layers = DynamicCache(config=core.config).layers
    except (TypeError, ValueError, AttributeError):
        return False
    return bool(layers) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)


def shared_prefix(examples: list[E]) -> int:
    """How many leading tokens all the examples have in common, leaving each at least one
    of its own (0 for a single example: nothing to share)."""
    if len(examples) < 2:
        return 0
    first, n = examples[0].ids, min(len(e.ids) for e in examples) - 1
    same = torch.ones(n, dtype=torch.bool)
    for e in examples[1:]:
        same &= e.ids[:n] == first[:n]
    return int(same.long().cumprod(0).sum())


def _cost(micro: list[E], shares: bool) -> int:
    """Tokens a micro-batch computes: its shared prefix once (when ``shares``), each row's
    rest padded to the longest."""
    shared = shared_prefix(micro) if shares else 0
    return shared + len(micro) * (max(len(e.ids) for e in micro) - shared)


def micro_batches(chosen: list[E], max_rows: int, max_tokens: int,
                  shares: bool = True) -> list[list[E]]:
    """The batch in micro-batches of at most ``max_rows`` rows and ``max_tokens`` tokens.

    Rows are sorted by how they start, then by length, so rows with the same prompt prefix
    (the system prompt and tool list every turn starts with) are neighbours, and ``Policy``
    computes that prefix once per micro-batch. A row joins the micro-batch before it only
    when that costs fewer tokens than computing it alone (padding to a longer row can cost
    more than the prefix saves). Which rows share a micro-batch does not change the
    gradient: the weights are per micro-batch (``trainer.train._train_step``)."""
    ordered = sorted(chosen, key=lambda e: (e.ids[:16].tolist(), len(e.ids)))
    micros: list[list[E]] = []
    for e in ordered:
        if micros and len(micros[-1]) < max_rows:
            cost = _cost([*micros[-1], e], shares)
            if cost <= max_tokens and cost <= _cost(micros[-1], shares) + len(e.ids):
                micros[-1].append(e)
                continue
        micros.append([e])
    return micros
