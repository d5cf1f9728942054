"""What the trainer's losses cost in time, and how its memory grows with length.

1. Step time: one OAPL+ECHO micro-step (chunked log-probs, both losses,
   backward; pi_lag already cached) against a bare HF+PEFT step on the same
   tokens (``model(ids, labels=ids).loss.backward()``, full logits, plain
   cross-entropy). Same model, same LoRA, gradient checkpointing on in both;
   the best of a few interleaved repetitions (the least disturbed by other
   load). The pi_lag pass (once per sequence per night) is shown on its own.
   Goal: ratio <= 1.15.
2. Peak memory of a whole micro-step (pi_lag pass, forward, backward, AdamW)
   on a tiny Llama (hidden 64, 2 layers, SmolLM2's 49152-token vocabulary) at
   2K, 8K and 24K tokens, as ratios to 2K. Goal: <= 1.5 at 24K. On CPU this
   is the growth of the process's peak RSS over its RSS before the step (Linux
   VmHWM, reset through /proc/self/clear_refs), each length in a fresh
   process; on a GPU, torch.cuda.max_memory_allocated. RSS counts freed heap
   memory glibc has not returned, so it is measured twice: with glibc's mmap
   threshold pinned at 1 MiB (freed tensors leave the RSS: live memory) and
   with glibc's default (what a CPU run really holds).
3. A shared prompt: one optimizer step (pi_lag pass, forward, backward) over a
   batch of sequences that start with the same prompt, as a night's rows do
   (the system prompt and tool list), computed as before (micro-batches of 2,
   every row whole) and with the prompt computed once per micro-batch; the
   loss must be the same. The rows are a night's own (``--night DIR/train.jsonl``)
   or synthetic: a 350-token prompt and 20-200 tokens of each row's own.
4. The compute dtype (``train.compute_dtype``): one optimizer step over such a
   batch with the decoder's products in float32 and in bfloat16 (autocast),
   interleaved, and how far bfloat16's pi_lag is from float32's per token.

    .venv/bin/python bench/train.py [--model DIR] [--tokens 512] [--reps 3] [--lengths 2048,8192,24576]
                                    [--night train.jsonl] [--rows 32] [--parts 1,2,3,4]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch

from trainer import train as T
from trainer.train_cli import read_rows

HF_DIR = ROOT / "data/models/smollm2-135m-instruct-hf"


def _example(length: int, vocab: int, seed: int = 0) -> T.Example:
    """A synthetic sequence: 8 judged messages over half the tokens, observations between."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (length,), generator=g)
    msg = torch.full((length,), -1)
    obs = torch.zeros(length, dtype=torch.bool)
    span = length // 16
    for i in range(8):
        start = 2 * i * span
        obs[start + 1:start + span] = True
        msg[start + span:start + 2 * span] = i
    tok_adv = torch.full((length,), math.nan)
    tok_adv[2 * span - 1] = -1.0
    adv = torch.linspace(-1, 1, 8)
    return T.Example(ids, msg, adv, tok_adv, obs, terms=9)


def _tiny_model_dir(tmp: Path) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(HF_DIR))
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tokenizer),
                         tie_word_embeddings=True, max_position_embeddings=32768)
    LlamaForCausalLM(config).save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    return tmp


# -- 1. step time -----------------------------------------------------------------


def step_time(model_dir: Path, tokens: int, reps: int) -> dict:
    settings = T.Settings(micro_batch=1)
    model = T.load_model(model_dir, settings)
    policy = T.Policy(model, settings.chunk)
    policy.train()
    example = _example(tokens, model.config.vocab_size)
    ids = example.ids[None]
    lag_s, ours_s, bare_s = [], [], []

    def bare() -> None:
        model(input_ids=ids, labels=ids).loss.backward()

    def ours() -> None:
        oapl, echo, _, _ = T.micro_losses(policy, [example], settings, 0, torch.device("cpu"))
        (oapl + echo).backward()

    def lag() -> None:
        example.lag = None
        T.fill_lag(model, policy, [example], settings, 0, torch.device("cpu"))

    for rep in range(reps + 1):  # the first round warms up and is not counted
        for fn, times in ((lag, lag_s), (bare, bare_s), (ours, ours_s)):
            started = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - started
            model.zero_grad(set_to_none=True)
            if rep:
                times.append(elapsed)
    bare_m, ours_m, lag_m = (min(x) for x in (bare_s, ours_s, lag_s))  # best of: least disturbed
    return {"bare_s": bare_m, "ours_s": ours_m, "lag_s": lag_m}


# -- 3. a shared prompt ------------------------------------------------------------


def _night_rows(path: Path | None, model_dir: Path, n: int, vocab: int) -> list[T.Example]:
    import random

    if path is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        examples = T.build_examples(read_rows(path), tokenizer, T.Settings())
        return random.Random(0).sample(examples, min(n, len(examples)))
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (350,), generator=g)
    out = []
    for i in range(n):
        own = 20 + (i * 37) % 181
        example = _example(350 + own, vocab, seed=i)
        example.ids[:350] = prompt
        example.msg[:350], example.obs[:350] = -1, False
        out.append(example)
    return out


def shared_prompt(model_dir: Path, night: Path | None, n: int) -> dict:
    from accelerate import Accelerator

    out = {}
    for name, settings in (("every row computed whole", T.Settings(micro_batch=2)),
                           ("prompt shared", T.Settings())):
        settings.gradient_checkpointing = False  # the night's "auto" for a 135M model
        original = T.sharing
        if name.startswith("every"):
            T.sharing = lambda model: False  # as before: every row computed whole
        try:
            model = T.load_model(model_dir, settings)
            examples = _night_rows(night, model_dir, n, model.config.vocab_size)
            trainable = [p for p in model.parameters() if p.requires_grad]
            policy = T.Policy(model, settings.chunk)
            policy.shares = T.sharing(model)
            ctx = {"accelerator": Accelerator(cpu=True), "settings": settings,
                   "policy": policy, "model": model,
                   "optimizer": torch.optim.SGD(trainable, lr=0.0), "trainable": trainable,
                   "pad_id": 0}
            started = time.perf_counter()
            event = T._train_step(ctx, examples)
            out[name] = {"s": time.perf_counter() - started, "loss": event["total"],
                         "tokens": event["tokens"],
                         "micro": [len(m) for m in T._micro_batches(examples, settings,
                                                                    T.sharing(model))]}
        finally:
            T.sharing = original
    return out


# -- 4. the compute dtype ------------------------------------------------------------


def dtype_step(model_dir: Path, night: Path | None, n: int, dtype: str) -> dict:
    """One optimizer step (its pi_lag pass included, as in a night's first pass) over the
    rows, the decoder's products in ``dtype``; its seconds, loss and the rows' pi_lag."""
    from accelerate import Accelerator

    settings = T.Settings(compute_dtype=dtype, gradient_checkpointing=False)
    model = T.load_model(model_dir, settings)
    examples = _night_rows(night, model_dir, n, model.config.vocab_size)
    trainable = [p for p in model.parameters() if p.requires_grad]
    ctx = {"accelerator": Accelerator(cpu=True), "settings": settings,
           "policy": T.Policy(model, settings.chunk, dtype), "model": model,
           "optimizer": torch.optim.SGD(trainable, lr=0.0), "trainable": trainable, "pad_id": 0}
    started = time.perf_counter()
    event = T._train_step(ctx, examples)
    return {"s": time.perf_counter() - started, "loss": event["total"], "tokens": event["tokens"],
            "lag": [e.lag for e in examples]}


def compute_dtypes(model_dir: Path, night: Path | None, n: int, reps: int) -> dict:
    """float32 against bfloat16, interleaved, the best of ``reps`` each; and how far the
    bfloat16 pi_lag is from float32's per read token."""
    runs: dict[str, list[dict]] = {"float32": [], "bfloat16": []}
    for _ in range(reps):
        for dtype, done in runs.items():
            done.append(dtype_step(model_dir, night, n, dtype))
    best = {dtype: min(done, key=lambda r: r["s"]) for dtype, done in runs.items()}
    token_diffs = []
    for exact, fast in zip(best["float32"]["lag"], best["bfloat16"]["lag"]):
        if exact is not None and fast is not None:
            read = exact != 0
            token_diffs.append((fast[read] - exact[read]).abs())
    diffs = torch.cat(token_diffs) if token_diffs else torch.zeros(1)
    return {"best": best, "token_mean": float(diffs.mean()), "token_max": float(diffs.max()),
            "token_p99": float(diffs.quantile(0.99)) if diffs.numel() > 1 else 0.0}


def part_four(args: argparse.Namespace) -> None:
    r = compute_dtypes(args.model, args.night, args.rows, args.reps)
    exact, fast = r["best"]["float32"], r["best"]["bfloat16"]
    print(f"\n4. the compute dtype: one step over {args.rows} rows ({exact['tokens']} tokens) of "
          f"{args.night or 'synthetic rows'}, {args.model.name}, pi_lag pass included, "
          f"best of {args.reps} interleaved:")
    for name, run in r["best"].items():
        print(f"   {name:9} {run['s']:7.1f} s  loss {run['loss']:.4f}")
    print(f"   speed-up {exact['s'] / fast['s']:.2f}x; bfloat16's pi_lag against float32's per "
          f"read token: mean {r['token_mean']:.4f}, 99th percentile {r['token_p99']:.4f}, "
          f"max {r['token_max']:.4f} nats")


# -- 2. memory --------------------------------------------------------------------


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_child(model_dir: Path, length: int) -> dict:
    """One micro-step at ``length`` tokens; the peak growth in MiB."""
    settings = T.Settings(micro_batch=1)
    model = T.load_model(model_dir, settings)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.lr)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    policy = T.Policy(model, settings.chunk)
    policy.train()
    example = _example(length, model.config.vocab_size)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        before = _rss_kb("VmRSS") * 1024
    started = time.perf_counter()
    T.fill_lag(model, policy, [example], settings, 0, device)
    oapl, echo, _, _ = T.micro_losses(policy, [example], settings, 0, device)
    (oapl + echo).backward()
    optimizer.step()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _rss_kb("VmHWM") * 1024
    how = "cuda max_memory_allocated" if device.type == "cuda" else "VmHWM - VmRSS"
    return {"length": length, "growth_mib": (peak - before) / 2**20, "before_mib": before / 2**20,
            "seconds": seconds, "how": how}


# glibc hands big blocks back to the kernel only above its mmap threshold, which it raises as
# blocks are freed; pinned at 1 MiB, freed tensors leave the RSS and the peak tracks live memory.
MALLOC_MODES = {"pinned": {"MALLOC_MMAP_THRESHOLD_": str(2**20)}, "glibc default": {}}


def memory(model_dir: Path, lengths: list[int]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for mode, env in MALLOC_MODES.items():
        out[mode] = []
        for length in lengths:
            proc = subprocess.run(
                [sys.executable, __file__, "--memory-child", str(length), "--model", str(model_dir)],
                capture_output=True, text=True, check=True,
                env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **env})
            out[mode].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=HF_DIR, help="model for the step-time part")
    parser.add_argument("--tokens", type=int, default=512, help="sequence length for the step time")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--lengths", default="2048,8192,24576")
    parser.add_argument("--night", type=Path, help="a night's train.jsonl for parts 3 and 4")
    parser.add_argument("--rows", type=int, default=32, help="rows in the batch of parts 3 and 4")
    parser.add_argument("--parts", default="1,2,3,4")
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(args.model, args.memory_child)))
        return 0

    started = time.perf_counter()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{'cuda' if torch.cuda.is_available() else 'cpu'}")
    parts = {int(x) for x in args.parts.split(",")}
    if 1 in parts:
        part_one(args)
    if 2 in parts:
        part_two(args)
    if 3 in parts:
        runs = shared_prompt(args.model, args.night, args.rows)
        (old, o), (new, n) = runs.items()
        print(f"\n3. one step over {args.rows} rows ({o['tokens']} tokens) of "
              f"{args.night or 'synthetic rows with a 350-token prompt'}, {args.model.name}:")
        for name, r in runs.items():
            print(f"   {name:32} {r['s']:7.1f} s  loss {r['loss']:.6f}  micro-batches {r['micro']}")
        print(f"   speed-up {o['s'] / n['s']:.2f}x; same loss: {abs(o['loss'] - n['loss']) < 1e-4}")
    if 4 in parts:
        part_four(args)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 0


def part_one(args: argparse.Namespace) -> None:
    t = step_time(args.model, args.tokens, args.reps)
    print(f"\n1. step time, {args.model.name}, {args.tokens} tokens, LoRA r=16, "
          f"gradient checkpointing, best of {args.reps}:")
    print(f"   bare HF+PEFT forward/backward (CE)   {t['bare_s']:.3f} s")
    print(f"   OAPL+ECHO forward/backward           {t['ours_s']:.3f} s   "
          f"ratio {t['ours_s'] / t['bare_s']:.2f} (goal <= 1.15)")
    print(f"   pi_lag pass (no_grad, once/sequence) {t['lag_s']:.3f} s   "
          f"ratio {t['lag_s'] / t['bare_s']:.2f}; first epoch incl. it: "
          f"{(t['ours_s'] + t['lag_s']) / t['bare_s']:.2f}")


def part_two(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runs = memory(_tiny_model_dir(Path(tmp)), [int(x) for x in args.lengths.split(",")])
    pinned, default = runs["pinned"], runs["glibc default"]
    print(f"\n2. peak memory of one micro-step (pi_lag pass, forward, backward, AdamW), tiny Llama\n"
          f"   (hidden 64, 2 layers, vocab 49152), chunk 512; {pinned[0]['how']}, growth over the\n"
          f"   RSS before the step, with glibc's mmap threshold pinned at 1 MiB / left at its default:")
    for p, d in zip(pinned, default):
        p_ratio = p["growth_mib"] / pinned[0]["growth_mib"]
        d_ratio = d["growth_mib"] / default[0]["growth_mib"]
        print(f"   {p['length']:>6} tokens  +{p['growth_mib']:6.1f} MiB  ratio {p_ratio:.2f}"
              f"   |  +{d['growth_mib']:6.1f} MiB  ratio {d_ratio:.2f}   ({p['seconds']:.1f} s)")
    print(f"   goal: <= 1.5 at {pinned[-1]['length']} tokens (the default's extra is freed heap memory "
          "glibc keeps, not live tensors)")


if __name__ == "__main__":
    sys.exit(main())
