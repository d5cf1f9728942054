"""A night's rows as training sequences: token ids with, per token, what it is to the
losses (a judged action's message slot, an override, an observation, a demonstration),
and the padded micro-batch tensors ``trainer.train`` computes on.

**A choice the attempts already made** (``train.imitate_known_choices``). Under a tool list
a demonstration's first action starts with a choice: answer in words (``message:`` and
the end after it) or call a tool (``functions.NAME:``). Where most attempts of its practice
group made that same first choice, the model needed the reference for its words or its
arguments, not for the choice; imitated anyway, the choice is taught to prompts that never
asked for it. With the setting off (the default), such a choice is left out of the
imitation (``known_choices``); a group where at most half chose it keeps it. On the kept
four-family days that kept the tool prompts' calls (30, 8 and 40 of 40 held-out answers
called a tool after the night, against 0, 12 and 32 with every choice imitated: on two of
the three days the arithmetic and protocol references, whose attempts answered in words,
had taught the tool prompts to answer in words too; docs/learning.md). Most, not all:
attempts are sampled at practice's temperature, and one stray call among four answers in
words says little about the greedy choice the held-out answers make.

The same holds for a passing attempt imitated beside OAPL (``night.imitate_passing``;
``train.imitate_known_passing_choices``, false by default, leaves its known choice out): a
compare attempt that passed in words is, in the tools view, nothing but the choice of words,
and every such attempt pushed that choice with a whole demonstration's weight. On two fresh
four-family days leaving it out gained +3.1 pp [+0.9, +5.6], the tool prompts keeping more of
their calls (docs/learning.md). A passing attempt whose choice most of its group did not make
(a call where the others answered in words) keeps it: that choice is what it shows."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from core.storage.events import REFERENCE
from trainer.tokens import ACTION, OBSERVATION, chose_words, render_row


class Rendering(Protocol):
    """What rendering reads of the training settings (``trainer.settings.Settings`` has it)."""

    max_tokens: int
    chat_format: str
    imitate_known_choices: bool
    imitate_known_passing_choices: bool


@dataclass
class Example:
    ids: torch.Tensor  # (T,) long
    msg: torch.Tensor  # (T,) long: slot in adv of a judged action token, else -1
    adv: torch.Tensor  # (m,) the judged messages' advantages
    tok_adv: torch.Tensor  # (T,) override advantages, NaN elsewhere
    obs: torch.Tensor  # (T,) bool: observation tokens
    terms: int  # OAPL terms this sequence adds (as oapl_loss counts them)
    lag: torch.Tensor | None = None  # (T,) log pi_lag, once computed
    demo: torch.Tensor | None = None  # (T,) bool: demonstration tokens (imitated)
    head: torch.Tensor | None = None  # (T,) bool: the tools view's choices (trainer.tokens)
    group: str = ""  # the practice group whose mean is its baseline (trainer.margins)
    episode: int | None = None  # the row's episode: a row gives one sequence per view

    def __post_init__(self) -> None:
        if self.demo is None:
            self.demo = torch.zeros(len(self.ids), dtype=torch.bool)
        if self.head is None:
            self.head = torch.zeros(len(self.ids), dtype=torch.bool)


def build_examples(rows: list[dict], tokenizer: Any, settings: Rendering) -> list[Example]:
    """The train split's rows as sequences with something to learn."""
    examples = []
    known = known_choices(rows, references=not settings.imitate_known_choices,
                          passing=not settings.imitate_known_passing_choices)
    for i, row in enumerate(rows):
        if row.get("split", "train") != "train":
            continue
        for seq in render_row(row, tokenizer, max_tokens=settings.max_tokens,
                              chat_format=settings.chat_format):
            example = _example(seq, known.get(i, set()))
            example.group = str(row.get("group") or "")
            example.episode = row.get("episode_id")
            if example.terms or bool(example.obs.any()) or bool(example.demo.any()):
                examples.append(example)
    return examples


def known_choices(rows: list[dict], references: bool = True,
                  passing: bool = False) -> dict[int, set[int]]:
    """Row index -> the demonstrated message whose choice under the tool list most attempts
    of the row's practice group made too (the module's doc): only a first action, of a
    reference (``references``) or of a passing attempt imitated beside OAPL (``passing``),
    and only where its group has attempts. Attempts of any split vote, the imitated one
    among them: the vote reads what the model chose, not what it is trained on."""
    chosen: dict[str, list[tuple[str, ...]]] = defaultdict(list)
    demonstrated = []
    for i, row in enumerate(rows):
        first = _first_action(row)
        if first is None:
            continue
        if (row.get("reward_source") or {}).get("check") == REFERENCE:
            if references:
                demonstrated.append((i, first))
            continue
        chosen[row["group"]].append(_choice(row["messages"][first]))
        if passing:
            demonstrated.append((i, first))
    out = {}
    for i, first in demonstrated:
        attempts = chosen[rows[i]["group"]]
        same = attempts.count(_choice(rows[i]["messages"][first]))
        if first in (rows[i].get("imitate") or ()) and 2 * same > len(attempts):
            out[i] = {first}
    return out


def _first_action(row: dict) -> int | None:
    """The index of a practice row's first own assistant message under a tool list, or None
    (no group, no tools, or a row that continues its episode after a compaction)."""
    if not row.get("group") or not row.get("tools"):
        return None
    start = row.get("context") or 0
    if start != (row.get("prefix_messages") or 0):
        return None
    harness = set(row.get("harness") or ())
    return next((i for i, m in enumerate(row["messages"])
                 if i >= start and i not in harness and m.get("role") == "assistant"), None)


def _choice(message: dict) -> tuple[str, ...]:
    """An assistant message's choice under a tool list: words, the tools it called, or none
    (text that was no choice of words: a bare call head, call syntax that failed, a step
    sent without tools), which matches no reference."""
    calls = message.get("tool_calls") or []
    if calls:
        return tuple(c["function"]["name"] for c in calls)
    return ("message",) if chose_words(message) else ()


def _example(seq: Any, known: AbstractSet[int] = frozenset()) -> Example:
    slots = {m: s for s, m in enumerate(sorted(seq.advantages))}
    kinds = torch.tensor(seq.kinds)
    msg = torch.tensor([slots.get(m, -1) if k == ACTION else -1
                        for k, m in zip(seq.kinds, seq.messages)])
    demo = torch.tensor([k == ACTION and m in seq.imitated
                         and not (m in known and t in seq.heads)
                         for t, (k, m) in enumerate(zip(seq.kinds, seq.messages))],
                        dtype=torch.bool)
    head = torch.tensor([t in seq.heads for t in range(len(seq.ids))], dtype=torch.bool)
    tok_adv = torch.full((len(seq.ids),), math.nan)
    for position, advantage in seq.token_advantages.items():
        tok_adv[position] = advantage
    in_message = msg.masked_fill(~torch.isnan(tok_adv), -1)
    terms = len(set(in_message[in_message >= 0].tolist())) + len(seq.token_advantages)
    return Example(torch.tensor(seq.ids), msg,
                   torch.tensor([seq.advantages[m] for m in sorted(seq.advantages)]),
                   tok_adv, kinds == OBSERVATION, terms, demo=demo, head=head)


def collate(examples: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors; message slots made unique across the micro-batch."""
    length = max(len(e.ids) for e in examples)
    b = len(examples)
    out = {"ids": torch.full((b, length), pad_id), "msg": torch.full((b, length), -1),
           "tok_adv": torch.full((b, length), math.nan), "obs": torch.zeros(b, length, dtype=torch.bool),
           "demo": torch.zeros(b, length, dtype=torch.bool),
           "head": torch.zeros(b, length, dtype=torch.bool),
           "lag": torch.zeros(b, length)}
    offset = 0
    for row, e in enumerate(examples):
        t = len(e.ids)
        out["ids"][row, :t] = e.ids
        out["msg"][row, :t] = torch.where(e.msg >= 0, e.msg + offset, e.msg)
        out["tok_adv"][row, :t] = e.tok_adv
        out["obs"][row, :t] = e.obs
        out["demo"][row, :t] = e.demo
        out["head"][row, :t] = e.head
        if e.lag is not None:
            out["lag"][row, :t] = e.lag
        offset += len(e.adv)
    out["adv"] = torch.cat([e.adv for e in examples]) if offset else torch.zeros(0)
    return out  # ids/msg/tok_adv/obs/demo/head/lag: (B, T); adv: (M,)


def oapl_reads(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, T) bool: the positions OAPL reads (judged actions and overridden tokens), the
    only ones where pi_lag is needed."""
    return (batch["msg"] >= 0) | ~torch.isnan(batch["tok_adv"])


def needed(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, T) bool: the positions a loss reads (OAPL's, observations, demonstrations);
    ``Policy`` skips the head everywhere else."""
    return oapl_reads(batch) | batch["obs"] | batch["demo"]
