"""The evaluation gate: is the candidate better than the live model, and no worse?

Both models answer greedily (temperature 0), in this process, through llama.cpp
(``llama_cpp.Llama``) on the same GGUF kind that is served, one model at a time:

- the held-out eval split (the first request of each eval episode), each
  answer scored -2..2 by the same judge as the night (the served model);
- verifiable probes (``night.probes_file``), by exact match (the expected text
  appears in the answer);
- a fixed set of open chat prompts, as a regression check: an answer that
  turns degenerate (repeats itself) where the live one did not, or a judged
  score that falls by more than ``night.regression_margin``, is a regression.
  Narrow training can hurt general chat.

The candidate passes when (eval gain + probe gain) >= ``night.gate_margin``
and there is no regression. With no held-out prompt and no probe there is no
evidence, and the candidate does not pass.
"""

from __future__ import annotations

import gc
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bot.serving.wire import neutral_messages
from trainer.client import JsonClient

OPEN_PROMPTS = [
    "Say hello to the channel in one sentence.",
    "What is 7 times 8?",
    "Give me three short tips for writing clear emails.",
    "What is a to-do list for? Answer in one sentence.",
    "Name one colour of the sky at sunset.",
]
SCORE_SYSTEM = ("You grade an AI assistant's answer to a request: 2 = excellent, 1 = good, "
                "0 = unclear, -1 = poor, -2 = wrong or harmful. Answer only with JSON.")
SCORE_SCHEMA = {"type": "object", "properties": {"score": {"enum": [-2, -1, 0, 1, 2]}},
                "required": ["score"]}


@dataclass
class Side:
    eval_score: float | None = None  # mean judged score in [-1, 1]
    probe_accuracy: float | None = None
    open_score: float | None = None
    degenerate: list[bool] = field(default_factory=list)


@dataclass
class GateReport:
    before: Side
    after: Side
    gain: float
    passed: bool
    reasons: list[str]

    def as_dict(self) -> dict:
        return asdict(self)


def repetition(text: str, n: int = 4) -> float:
    """Share of word n-grams that repeat an earlier one: near 1 for a loop."""
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(max(0, len(words) - n + 1))]
    return 0.0 if len(grams) < 4 else 1 - len(set(grams)) / len(grams)


def generate(gguf: Path, prompts: list[list[dict]], max_tokens: int, n_ctx: int,
             lora: Path | None = None) -> list[str]:
    """Greedy answers of one model, loaded for this call only."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), lora_path=str(lora) if lora else None, n_ctx=n_ctx,
                chat_format="chatml", verbose=False, seed=0)
    try:
        return [llm.create_chat_completion(messages=neutral_messages(p), temperature=0,
                                         max_tokens=max_tokens)
                ["choices"][0]["message"]["content"] or "" for p in prompts]
    finally:
        del llm
        gc.collect()


async def judged_scores(client: JsonClient, prompts: list[list[dict]], answers: list[str]
                        ) -> list[float]:
    scores = []
    for prompt, answer in zip(prompts, answers):
        request = prompt[-1]["content"]
        found, _ = await client.ask(
            [{"role": "system", "content": SCORE_SYSTEM},
             {"role": "user", "content": f"Request: {request}\n\nAnswer: {answer}"}],
            SCORE_SCHEMA, 16, "gate_score")
        if isinstance(found, dict) and found.get("score") in (-2, -1, 0, 1, 2):
            scores.append(found["score"] / 2)
    return scores


def eval_prompts(rows: list[dict], limit: int) -> list[list[dict]]:
    """System prompt + first user message of each held-out episode."""
    prompts = []
    for row in rows:
        if row.get("kind") != "episode" or row.get("split") != "eval":
            continue
        system = [m for m in row["messages"][:1] if m["role"] == "system"]
        user = next((m for m in row["messages"] if m["role"] == "user"), None)
        if user and isinstance(user.get("content"), str):
            prompts.append([*system, {"role": "user", "content": user["content"]}])
    return prompts[:limit]


async def measure(client: JsonClient, gguf: Path, lora: Path | None, evals: list[list[dict]],
                  probes: list[dict], max_tokens: int, n_ctx: int) -> Side:
    opens = [[{"role": "user", "content": p}] for p in OPEN_PROMPTS]
    probe_prompts = [[{"role": "user", "content": p["prompt"]}] for p in probes]
    answers = generate(gguf, evals + probe_prompts + opens, max_tokens, n_ctx, lora)
    eval_answers = answers[:len(evals)]
    probe_answers = answers[len(evals):len(evals) + len(probes)]
    open_answers = answers[len(evals) + len(probes):]
    side = Side(degenerate=[repetition(a) > 0.5 for a in open_answers])
    if evals:
        scores = await judged_scores(client, evals, eval_answers)
        side.eval_score = sum(scores) / len(scores) if scores else None
    if probes:
        hits = [_normal(p["expected"]) in _normal(a) for p, a in zip(probes, probe_answers)]
        side.probe_accuracy = sum(hits) / len(hits)
    opened = await judged_scores(client, opens, open_answers)
    side.open_score = sum(opened) / len(opened) if opened else None
    return side


def decide(before: Side, after: Side, margin: float, regression_margin: float) -> GateReport:
    gains, reasons = [], []
    if before.eval_score is not None and after.eval_score is not None:
        gains.append(after.eval_score - before.eval_score)
    if before.probe_accuracy is not None and after.probe_accuracy is not None:
        gains.append(after.probe_accuracy - before.probe_accuracy)
    gain = sum(gains)
    if not gains:
        reasons.append("no held-out prompt or probe to evaluate on")
    elif gain < margin:
        reasons.append(f"gain {gain:+.3f} is below the margin {margin:+.3f}")
    newly = [i for i, (b, a) in enumerate(zip(before.degenerate, after.degenerate)) if a and not b]
    if newly:
        reasons.append(f"open prompts {newly} turned degenerate (repetition)")
    if before.open_score is not None and after.open_score is not None \
            and after.open_score < before.open_score - regression_margin:
        reasons.append(f"open chat score fell from {before.open_score:.2f} to {after.open_score:.2f}")
    return GateReport(before, after, gain, not reasons, reasons)


def _normal(text: str) -> str:
    return " ".join(text.lower().split())
