"""One side of the gate (``trainer.gate``): one model's greedy answers to the night's
items and open prompts, asked as the agent asks, and their scores.

Checks score the held-out items (in the sandbox, ``trainer.gate_checks``); the judge
(the live model, served) scores the eval split and open chat. ``measure_model`` runs a
side alone: the night measures the live model before it trains, so the gate's time is
known when the training's budget is set.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

from core.config import Config
from core.model.chat_format import resolve_async
from core.model.shim import patch_handlers
from core.storage.store import Store
from trainer.client import JsonClient
from trainer.gate_checks import SandboxScorer
from trainer.gate_items import (
    OPEN_PROMPTS,
    AgentView,
    Item,
    agent_view,
    ask_like_agent,
    eval_items,
    heldout_items,
    score_check,
)
from trainer.loops import loops

SCORE_SYSTEM = ("You grade an AI assistant's answer to a request: 2 = excellent, 1 = good, "
                "0 = unclear, -1 = poor, -2 = wrong or harmful. Answer only with JSON.")
SCORE_SCHEMA = {"type": "object", "properties": {"score": {"enum": [-2, -1, 0, 1, 2]}},
                "required": ["score"]}
# Answers are cut here (the agent's own limit, if lower, applies): enough for a check on an
# answer's start and for repetition to show, and it bounds the gate's time on a CPU.
GATE_MAX_TOKENS = 128
GATE_CONTEXT = 4096

# (check, answer) -> [0, 1], or None: unscored; may be async (trainer.gate_checks).
Scorer = Callable[[dict, str], "float | None | Awaitable[float | None]"]


@dataclass
class Side:
    """One model's answers: item id -> score in [0, 1] (None: unscored), and open chat."""

    scores: dict[str, float | None] = field(default_factory=dict)
    open_score: float | None = None  # mean judged open-chat score in [-1, 1]
    degenerate: list[bool] = field(default_factory=list)  # per open prompt
    answers: dict[str, str] = field(default_factory=dict)
    open_answers: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # checks that could not run, why

    def kept(self) -> dict:
        """What the night keeps of a side measured before training (its progress, JSON):
        no item's answer, since the eval items are users' own requests and ``/forget``
        does not reach the job's row; the gate's decision reads none of them."""
        return {**asdict(self), "answers": {}}


def generate(gguf: Path, requests: list[str], view: AgentView, chat_format: str,
             max_tokens: int, n_ctx: int, lora: Path | None = None) -> list[str]:
    """Greedy answers of one model, loaded for this call only, asked as the agent asks,
    with the served handler's patches (templates unescaped, calls bounded)."""
    from llama_cpp import Llama

    patch_handlers()
    llm = Llama(model_path=str(gguf), lora_path=str(lora) if lora else None, n_ctx=n_ctx,
                chat_format=chat_format, verbose=False, seed=0)
    try:
        return ask_like_agent(llm, [view.render(r) for r in requests], view.tools, chat_format,
                              max_tokens)
    finally:
        del llm
        gc.collect()


async def judged_scores(client: JsonClient, requests: list[str], answers: list[str]
                        ) -> list[float | None]:
    """The judge's score of each answer in [-1, 1]; None where it gave none."""
    scores: list[float | None] = []
    for request, answer in zip(requests, answers):
        found, _ = await client.ask(
            [{"role": "system", "content": SCORE_SYSTEM},
             {"role": "user", "content": f"Request: {request}\n\nAnswer: {answer}"}],
            SCORE_SCHEMA, 16, "gate_score")
        ok = isinstance(found, dict) and found.get("score") in (-2, -1, 0, 1, 2)
        scores.append(found["score"] / 2 if ok else None)
    return scores


async def score_side(client: JsonClient, items: list[Item], answers: list[str],
                     open_answers: list[str], scorer: Scorer = score_check) -> Side:
    """Score one model's answers: checks by ``scorer``, the rest and open chat by the judge."""
    side = Side(answers={i.id: a for i, a in zip(items, answers)},
                degenerate=[loops(a) for a in open_answers],
                open_answers=list(open_answers))
    judged = [(i, a) for i, a in zip(items, answers) if i.check is None]
    scores = await judged_scores(client, [i.request for i, _ in judged], [a for _, a in judged])
    side.scores.update({i.id: None if s is None else (s + 1) / 2
                        for (i, _), s in zip(judged, scores)})
    for item, answer in zip(items, answers):
        if item.check is not None:
            score = scorer(item.check, answer)
            side.scores[item.id] = await score if inspect.isawaitable(score) else score
    opened = [s for s in await judged_scores(client, OPEN_PROMPTS, open_answers) if s is not None]
    side.open_score = sum(opened) / len(opened) if opened else None
    return side


@dataclass
class Asking:
    """How both sides are asked: the night's items, the agent's view, the model's limits."""

    items: list[Item]
    view: AgentView
    chat_format: str
    max_tokens: int
    n_ctx: int


async def asking_of(config: Config, store: Store, rows: list[dict], args: dict) -> Asking:
    items = heldout_items(config, args) + eval_items(rows, config.night.eval_max)
    # The context is bounded because of llama-cpp-python's endless tool arguments (see
    # gate_items.ask_like_agent): each one fills the context before it fails, and 4,096
    # tokens still hold the agent's prompt with the full tool list (about 3,300) and an
    # answer. A longer request fails alike on both sides, as an empty answer.
    return Asking(items, await agent_view(config, store, args),
                  (await resolve_async(config)).name,  # as the bot resolves it
                  min(config.agent.max_reply_tokens, GATE_MAX_TOKENS),
                  min(config.model.context_tokens, GATE_CONTEXT))


async def pin_view(config: Config, store: Store, args: dict, folder: Path) -> str:
    """The agent's view written once into the night's folder, for both sides to render
    with: without the bot's view file (a night started from the command line), each side
    would read the tools of the newest stored episode, and a chat between the two sides
    could change them. Returns the file's path, for ``args["agent_view"]``."""
    view = await agent_view(config, store, args)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "agent-view.json"
    partial = path.with_name(f"{path.name}.partial")
    text = json.dumps({"system": view.system, "tools": view.tools}, ensure_ascii=False)
    await asyncio.to_thread(partial.write_text, text)
    os.replace(partial, path)
    return str(path)


async def measure(client: JsonClient, model: tuple[Path, Path | None], asking: Asking,
                  scorer: Scorer = score_check) -> Side:
    """One model's side: its answers, scored; ``failures`` are the checks that could not
    run for this side alone (a gate's two sides share one scorer)."""
    gguf, lora = model
    earlier = len(getattr(scorer, "failures", []))
    items = asking.items
    answers = await asyncio.to_thread(generate, gguf, [i.request for i in items] + OPEN_PROMPTS,
                                      asking.view, asking.chat_format, asking.max_tokens,
                                      asking.n_ctx, lora)
    side = await score_side(client, items, answers[:len(items)], answers[len(items):], scorer)
    side.failures = list(getattr(scorer, "failures", []))[earlier:]
    return side


async def measure_model(config: Config, store: Store, rows: list[dict], args: dict,
                        model: tuple[Path, Path | None], scorer: Scorer | None = None) -> Side:
    """One side alone (the night's live model, before it trains)."""
    asking = await asking_of(config, store, rows, args)
    client = JsonClient.for_config(config)
    try:
        return await measure(client, model, asking, scorer or SandboxScorer(config))
    finally:
        await client.close()
