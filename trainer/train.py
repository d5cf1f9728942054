"""The night's LoRA update: OAPL on judged actions, ECHO on observations, imitation of
demonstrations.

Algorithm, per optimizer step over a batch of ``batch`` sequences ([train].batch; the
settings are ``trainer.settings.Settings``, the by-hand command ``trainer.train_cli``):

1. pi_lag = the served checkpoint = this model with the LoRA disabled. Its
   log-prob of every token is computed once, under ``no_grad``, the first time
   a sequence is drawn (before any update that uses it), and cached: the base
   never changes, so later epochs reuse it. In adapter mode the night continues
   the live adapter (``start_adapter``): pi_lag is the model with it as loaded,
   so every sequence's log-probs are computed before the first update.
2. For each micro-batch: log pi_theta of every token, in chunks (below);
   ``oapl_loss`` on action tokens, ``echo_loss`` on observation tokens and
   ``imitation_loss`` on demonstrations (``trainer.losses``); backward,
   weighted so the accumulated gradient is that of the batch means (messages
   for OAPL, sequences for ECHO, sequences, tokens or choice-and-words parts for
   imitation as ``train.imitation_per`` says).
3. Clip the gradient to norm 1 and take an AdamW step on the LoRA only, at the
   step's rate (``trainer.lr_schedule``: a warmup, then constant or decaying).

Steps and batches are ``trainer.plan``'s: ``steps`` when set, else ``epochs`` passes
but never fewer than ``min_steps`` (16, the prototype's count that lifted held-out exact
match by +24 pp), a small night's batches shrinking rather than repeating it past
``max_epochs``; the remainder batch weighs its size over the batch size.

**Budget.** With ``time_budget_s`` (the night's ``night.budget_s`` less its other
stages) a night that would run past it trains fewer steps, and says so
(``TrainResult.budget_note``): before the first step an earlier night's tokens/s sets
the most steps it may take and the learning-rate schedule's length; after each step
this night's mean step time decides how many of those it takes (``trainer.budget``),
keeping time for the margins' pass over the mixed groups after the loop
(``MEASURE_SHARE``).

**Stopping on evidence.** With ``stop_split`` > 0 that share of the mixed practice
groups is held out of training and scored every ``stop_every`` steps; the night keeps
the best check's weights and stops when ``stop_patience`` checks in a row gain nothing
(``trainer.stopping``, ``TrainResult.stop_note``).

**Groups.** After the loop, every practice group with mixed rewards is measured:
the spread of its advantages and the change in mean per-token log-prob of its passing
attempts against its failing ones, trained against pi_lag (``trainer.margins``).

Memory: the LoRA (r=16, alpha=32, no dropout) sits on q, k, v, o, gate, up and
down; gradient checkpointing is on; sequences are right-padded with no
attention mask (causal attention never lets a real token see the padding
after it), so attention takes its fused causal path. Log-probs never build a
``[seq, vocab]`` logits tensor: the decoder runs to hidden states and
``trainer.policy.TargetLogProb`` applies the (frozen, tied) lm_head and log-softmax per chunk
of ``chunk`` positions. Its backward needs no second pass over the
vocabulary: for a frozen head, d log p(y_t)/d h_t = W[y_t] - E_{p_t}[W], one
vector per position, stored in the forward.

Placement: ``Accelerator()`` puts the model on the GPU when there is one (CPU
otherwise) and reads the user's accelerate config. A GPU too small for the
model: choose FSDP with ``fsdp_offload_params: true`` in ``accelerate config``
(parameters live on the CPU between uses), and/or set ``offload_activations``
(the checkpointed activations wait in host memory). Several GPUs or nodes::

    accelerate config            # once: multi-GPU / multi-node, FSDP or DDP, mixed precision
    accelerate launch -m trainer.train --data night.jsonl --base DIR --out DIR [--steps N]

Each process trains its share of every batch; losses are scaled so the
averaged gradient equals the single-process one.

Simplifications:
- Rows are rendered by ``trainer.tokens`` (see its exactness notes); sequences
  longer than ``max_tokens`` are cut, and an action cut in two is dropped.
- pi_lag is the float HF base; the served model is its q8_0 GGUF, so the
  log-ratio at step 0 is 0 by construction, not the served model's exact value.
- Stats in the progress events come from the main process's share of the batch.
- DeepSpeed ZeRO-3 is not supported (the chunked head reads lm_head's weight
  directly).
"""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.budget import affordable_steps, estimated_steps, note
from trainer.examples import (  # noqa: F401 - re-exported
    Example,
    build_examples,
    collate,
    needed,
    oapl_reads,
)
from trainer.losses import echo_loss, imitation_loss, imitation_parts, oapl_loss
from trainer.lr_schedule import check, lr_factor
from trainer.margins import changes_under, in_mixed_groups, measure
from trainer.plan import batches, plan
from trainer.policy import Policy, micro_batches, shared_prefix, sharing
from trainer.settings import Settings, TrainResult
from trainer.stopping import Stopper, split

# The margins' pass after the loop (no gradient, shared prefixes) costs about this share of
# a training step's time per token: on a four-family bench night (2026-12-07) about 100 s
# after 753 s of steps over as many tokens, 0.13; rounded up, since running past the budget
# is worse than one step fewer.
MEASURE_SHARE = 0.25
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# -- model --------------------------------------------------------------------------


def load_model(base_dir: str | Path, settings: Settings) -> Any:
    """The base checkpoint in float32 with a fresh LoRA (B = 0, so pi_theta = pi_lag), or
    with ``settings.start_adapter`` loaded to train on."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(settings.seed)
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    base.config.use_cache = False
    if settings.gradient_checkpointing:
        base.activation_checkpointing_enable({"use_reentrant": False},
                                             offload=settings.offload_activations)
    if settings.start_adapter:
        from peft import PeftModel

        return PeftModel.from_pretrained(base, str(settings.start_adapter), is_trainable=True)
    config = LoraConfig(r=settings.lora_r, lora_alpha=settings.lora_alpha, lora_dropout=0.0,
                        target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # peft still asks for the deprecated checkpointing name
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        return get_peft_model(base, config)


# -- loop ---------------------------------------------------------------------------


def _micro_batches(chosen: list[Example], settings: Settings,
                   shares: bool = True) -> list[list[Example]]:
    return micro_batches(chosen, settings.micro_batch, settings.micro_tokens, shares)


@torch.no_grad()
def fill_lag(model: Any, policy: nn.Module, examples: list[Example], settings: Settings,
             pad_id: int, device: torch.device, shares: bool | None = None) -> None:
    """pi_lag's log-probs for the examples that lack them: the adapter disabled (a fresh
    LoRA's base), or as it is (a continued adapter, before any update). ``shares``: whether
    a shared prompt is computed once (``trainer.policy.sharing``; asked when not given).

    Only OAPL reads pi_lag, and only at its actions: a sequence with no OAPL term (only
    observations or a demonstration, a seventh of a practice night's tokens) gets zeros
    without a pass, and the head is applied at action positions alone."""
    for e in examples:
        if e.lag is None and not e.terms:
            e.lag = torch.zeros(len(e.ids))
    missing = [e for e in examples if e.lag is None]
    if not missing:
        return
    shares = sharing(model) if shares is None else shares
    served = contextlib.nullcontext() if settings.start_adapter else model.disable_adapter()
    with served:
        for micro in _micro_batches(missing, settings, shares):
            batch = collate(micro, pad_id)
            logp = policy(batch["ids"].to(device), shared_prefix(micro),
                          oapl_reads(batch).to(device)).float().cpu()  # (B, T)
            for row, e in enumerate(micro):
                e.lag = logp[row, :len(e.ids)]


def micro_losses(policy: nn.Module, micro: list[Example], settings: Settings, pad_id: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    batch = {k: v.to(device) for k, v in collate(micro, pad_id).items()}
    logp = policy(batch["ids"], shared_prefix(micro), needed(batch))  # (B, T)
    oapl, stats = oapl_loss(logp, batch["lag"], batch["msg"], batch["adv"], beta=settings.beta,
                            token_adv=batch["tok_adv"])
    echo = echo_loss(logp, batch["obs"], lam=settings.echo_lambda)
    imitation = imitation_loss(logp, batch["demo"], weight=settings.imitation,
                               per=settings.imitation_per, head=batch["head"])
    return oapl, echo, imitation, stats


def _train_step(ctx: dict, chosen: list[Example], weight: float = 1.0) -> dict:
    """One optimizer step over this process's share of a batch, its loss scaled by
    ``weight`` (the remainder batch's size share); returns its event."""
    acc, settings, policy = ctx["accelerator"], ctx["settings"], ctx["policy"]
    started = time.perf_counter()
    mine = chosen[acc.process_index::acc.num_processes]
    # Asked once per night, not per step: it walks the model's modules.
    shares = ctx.setdefault("shares", sharing(ctx["model"]))
    fill_lag(ctx["model"], policy, mine, settings, ctx["pad_id"], acc.device, shares)
    # Weights that turn micro-batch means into batch means, across processes too.
    all_terms = max(sum(e.terms for e in chosen), 1)
    all_obs = max(sum(bool(e.obs.any()) for e in chosen), 1)
    demos = sum(bool(e.demo.any()) for e in chosen)
    per = settings.imitation_per
    all_demo = max(sum(imitation_parts(e.demo, e.head, per) for e in chosen), 1)
    totals = {"oapl": 0.0, "echo": 0.0, "imitation": 0.0, "pos": 0.0, "n_pos": 0.0, "neg": 0.0, "n_neg": 0.0}
    micros = _micro_batches(mine, settings, shares)
    for i, micro in enumerate(micros):
        w_oapl = sum(e.terms for e in micro) / all_terms * acc.num_processes * weight
        w_echo = sum(bool(e.obs.any()) for e in micro) / all_obs * acc.num_processes * weight
        w_demo = (sum(imitation_parts(e.demo, e.head, per) for e in micro) / all_demo
                  * acc.num_processes * weight)
        sync = acc.no_sync(policy) if i < len(micros) - 1 else contextlib.nullcontext()
        with sync:
            oapl, echo, imitation, stats = micro_losses(policy, micro, settings, ctx["pad_id"],
                                                        acc.device)
            acc.backward(oapl * w_oapl + echo * w_echo + imitation * w_demo)
        totals["oapl"] += float(oapl.detach()) * w_oapl / acc.num_processes
        totals["echo"] += float(echo.detach()) * w_echo / acc.num_processes
        totals["imitation"] += float(imitation.detach()) * w_demo / acc.num_processes
        for sign in ("pos", "neg"):
            if stats[f"n_{sign}"]:
                totals[sign] += stats[f"logratio_{sign}"] * stats[f"n_{sign}"]
                totals[f"n_{sign}"] += stats[f"n_{sign}"]
    grad_norm = acc.clip_grad_norm_(ctx["trainable"], settings.grad_clip)
    ctx["optimizer"].step()
    ctx["optimizer"].zero_grad(set_to_none=True)
    tokens = sum(len(e.ids) for e in mine)
    seconds = time.perf_counter() - started
    return {
        "oapl": totals["oapl"], "echo": totals["echo"], "imitation": totals["imitation"] if demos else None,
        "total": totals["oapl"] + totals["echo"] + totals["imitation"],
        "logratio_pos": totals["pos"] / totals["n_pos"] if totals["n_pos"] else None,
        "logratio_neg": totals["neg"] / totals["n_neg"] if totals["n_neg"] else None,
        "grad_norm": float(grad_norm), "weight": weight, "sequences": len(mine), "tokens": tokens,
        "seconds": seconds, "tokens_per_s": tokens / max(seconds, 1e-9),
    }


def _set_rate(optimizer: torch.optim.Optimizer, rate: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = rate


def train(rows: list[dict], base_dir: str | Path, out_dir: str | Path,
          settings: Settings | None = None,
          on_step: Callable[[dict], None] | None = None) -> TrainResult:
    """Train a LoRA on the rows and save it (adapter_config.json, adapter_model.safetensors)."""
    from accelerate import Accelerator
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    settings = settings or Settings()
    check(settings.schedule, settings.warmup_steps)  # before minutes of loading
    if not Path(base_dir, "config.json").is_file():  # else transformers takes it for a hub id
        raise FileNotFoundError(f"the base checkpoint {base_dir} is missing (no config.json "
                                "there); point it at an HF model folder")
    started = time.perf_counter()
    accelerator = Accelerator()
    # data
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    examples = build_examples(rows, tokenizer, settings)
    if not examples:
        raise ValueError("no training sequence: no train-split row has a judged action or an observation")
    if len(examples) < accelerator.num_processes:
        raise ValueError(f"{len(examples)} training sequences for {accelerator.num_processes} "
                         "processes: launch fewer processes")
    examples, held = split(examples, settings.stop_split, settings.seed)
    steps, batch = plan(len(examples), settings, accelerator.num_processes)
    settings = replace(settings, batch=batch)
    # model
    model = load_model(base_dir, settings)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.lr, weight_decay=0.0)
    policy = Policy(model, settings.chunk, settings.compute_dtype)
    policy, optimizer = accelerator.prepare(policy, optimizer)
    policy.train()
    ctx = {"accelerator": accelerator, "settings": settings, "policy": policy, "model": model,
           "optimizer": optimizer, "trainable": trainable, "pad_id": pad_id}
    if settings.start_adapter:  # the adapter moves from the first step: pi_lag before it
        fill_lag(model, policy, examples, settings, pad_id, accelerator.device)
    stopper = _stopper(ctx, [e for e in held if e.terms])
    # loop
    history, seen = [], 0
    planned = steps
    tokens_per_step = batch * sum(len(e.ids) for e in examples) / len(examples)
    measured = in_mixed_groups(examples)  # the margins' forward pass after the loop
    # That pass, in steps' time: every process reads all of them, in the time one step
    # gives its share of a batch.
    reserve_steps = (sum(len(e.ids) for e in measured) / tokens_per_step
                     * accelerator.num_processes * MEASURE_SHARE)
    # The schedule's length, fixed before the first step so that the rate never rises
    # again: the steps an earlier night's rate says fit (``trainer.budget``).
    rate = settings.expected_tokens_per_s
    horizon = steps = estimated_steps(
        planned, tokens_per_step, rate,
        _less(_left(settings, started), reserve_steps * tokens_per_step / rate if rate else 0.0))
    show = settings.progress and accelerator.is_local_main_process
    bar = tqdm(total=steps, desc="train", disable=not show)
    order = batches(len(examples), settings, accelerator.num_processes)
    step = 0
    while step < steps:
        chosen, weight = next(order)
        step += 1
        _set_rate(optimizer, settings.lr * lr_factor(step - 1, horizon, settings.schedule,
                                                     settings.warmup_steps))
        event = {"step": step, "steps": steps, "lr": optimizer.param_groups[0]["lr"],
                 **_train_step(ctx, [examples[i] for i in chosen], weight)}
        seen += event["tokens"]
        history.append(event)
        step_s = sum(h["seconds"] for h in history) / len(history)
        # Capped by the horizon, not by the last cut: slow early steps (pi_lag's pass) must
        # not cut the night for good once its steps speed up.
        steps = affordable_steps(horizon, step, time.perf_counter() - started,
                                 _less(settings.time_budget_s, reserve_steps * step_s),
                                 step_s)
        bar.total = steps
        bar.update(1)
        bar.set_postfix(oapl=f"{event['oapl']:.4f}", echo=f"{event['echo']:.4f}",
                        tok_s=f"{event['tokens_per_s']:.0f}")
        if on_step is not None and accelerator.is_main_process:
            on_step(event)
        if stopper.due(step) and step < steps and stopper.score(step):
            break
    bar.close()
    if stopper.held and (not stopper.checks or stopper.checks[-1]["step"] != step):
        stopper.score(step)
    stopper.restore(step)
    stopped = stopper.note(step, steps)
    rate = seen / max(sum(h["seconds"] for h in history), 1e-9)
    # what the night learnt from its practice groups (trainer.margins)
    unwrapped = accelerator.unwrap_model(policy)
    shares = ctx.setdefault("shares", sharing(model))
    fill_lag(model, unwrapped, measured, settings, pad_id, accelerator.device, shares)
    groups = measure(unwrapped, measured, settings.micro_batch, settings.micro_tokens, pad_id,
                     accelerator.device, shares) if measured else []
    # save
    accelerator.wait_for_everyone()
    out = Path(out_dir)
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        accelerator.unwrap_model(policy).model.save_pretrained(str(out))
    # Only when the budget ended it: a night the stopper ended early says so in its own note.
    cut = (note(step, planned, rate, settings.time_budget_s, reserve_steps * step_s)
           if step == steps < planned else "")
    return TrainResult(out, step, len(examples), seen, time.perf_counter() - started, history,
                       model, batch, planned, cut, rate, groups, stopped, stopper.checks)


def _stopper(ctx: dict, held: list[Example]) -> Stopper:
    """The night's stopping checks on its held-out practice groups (trainer.stopping):
    their pi_lag log-probs now, before any update moves the adapter."""
    settings, acc = ctx["settings"], ctx["accelerator"]
    shares = ctx.setdefault("shares", sharing(ctx["model"]))
    if held:
        fill_lag(ctx["model"], ctx["policy"], held, settings, ctx["pad_id"], acc.device, shares)

    def measure_held(examples: list[Example]) -> list[float | None]:
        return changes_under(ctx["policy"], examples, settings.micro_batch,
                             settings.micro_tokens, ctx["pad_id"], acc.device, shares)

    return Stopper(held, settings.stop_every, settings.stop_patience, measure_held,
                   ctx["trainable"])


def _less(budget_s: float | None, seconds: float) -> float | None:
    """The budget less the margins' pass (``MEASURE_SHARE``); no budget stays none."""
    return None if budget_s is None else budget_s - seconds


def _left(settings: Settings, started: float) -> float | None:
    if settings.time_budget_s is None:
        return None
    return settings.time_budget_s - (time.perf_counter() - started)


if __name__ == "__main__":  # python -m trainer.train: the by-hand command
    from trainer.train_cli import main

    sys.exit(main())
