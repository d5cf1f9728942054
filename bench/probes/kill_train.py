"""kill -9 during training: ``python -m trainer.train`` on a tiny random Llama (hidden 64,
2 layers, the real SmolLM2 tokenizer, as tests/test_train.py builds it) is SIGKILLed once
its progress bar shows a step, and then run again.

After each kill: the base checkpoint is byte for byte unchanged, no adapter file claims a
finished training (the adapter is written only at the end), and the bot's night watch marks
a night job naming the dead process as failed, with the command that resumes it. Then the
rerun (what a resumed night does for a training that did not finish) completes and writes
an adapter whose tensors load and are finite.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from bench.probes import Tally
from bench.probes.world import runtime

ROOT = Path(__file__).resolve().parents[2]
HF_DIR = ROOT / "data/models/smollm2-135m-instruct-hf"


def tiny_base(path: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(HF_DIR))
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tokenizer),
                         tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def argv(data: Path, base: Path, out: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "trainer.train", "--data", str(data), "--base", str(base),
            "--out", str(out), "--steps", str(steps), "--batch", "2", "--micro-batch", "2",
            "--lr", "2e-3", "--max-tokens", "256"]


async def kill_mid_training(command: list[str], timeout: float = 240) -> tuple[int, str]:
    """Start the training, SIGKILL it once tqdm shows a finished step; (pid, last progress)."""
    proc = await asyncio.create_subprocess_exec(*command, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    seen = b""
    try:
        async with asyncio.timeout(timeout):
            while True:
                chunk = await proc.stderr.read(4096)
                if not chunk:
                    raise RuntimeError(f"training ended before a step: {seen[-500:]!r}")
                seen += chunk
                progress = seen.replace(b"\r", b"\n").splitlines()[-1]
                if progress.startswith(b"train:") and b"| 0/" not in progress and b"/" in progress:
                    break
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await proc.wait()
    return proc.pid, progress.decode(errors="replace")[:80]


async def _watch_marks_failed(tally: Tally, rt, pid: int, i: int) -> None:
    job_id = await rt.store.create_job("sleep", {"channel": "general"})
    await rt.store.update_job(job_id, state="training", pid=pid)
    await rt.night.poll()
    job = await rt.store.job(job_id)
    tally.check(f"kill {i}: the night watch marks the job failed, naming the resume command",
                job["state"] == "failed" and f"python -m trainer sleep --job {job_id}" in job["error"],
                (job["state"], job["error"]))


async def run(tally: Tally, work: Path, quick: bool) -> None:
    import torch
    from safetensors.torch import load_file

    from tests.test_train import _rows

    base, data, out = work / "tiny-base", work / "rows.jsonl", work / "adapter"
    await asyncio.to_thread(tiny_base, base)
    data.write_text("".join(json.dumps(row) + "\n" for row in _rows()))
    before = digest(base)
    async with runtime(work / "bot") as rt:
        for i in range(1, (1 if quick else 2) + 1):
            pid, progress = await kill_mid_training(argv(data, base, out, steps=5000))
            tally.check(f"kill {i}: killed mid-training ({progress.strip()})", "train:" in progress)
            tally.check(f"kill {i}: the base checkpoint is unchanged", digest(base) == before)
            tally.check(f"kill {i}: no adapter claims a finished training",
                        not (out / "adapter_model.safetensors").exists(),
                        sorted(os.listdir(out)) if out.exists() else "no folder")
            await _watch_marks_failed(tally, rt, pid, i)
    start = time.monotonic()
    rerun = await asyncio.create_subprocess_exec(*argv(data, base, out, steps=4), cwd=ROOT,
                                                 stdout=asyncio.subprocess.PIPE,
                                                 stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await rerun.communicate()
    tally.check("the rerun completes", rerun.returncode == 0, stderr[-400:].decode(errors="replace"))
    tensors = load_file(out / "adapter_model.safetensors") if rerun.returncode == 0 else {}
    tally.check("the rerun's adapter loads and is finite",
                tensors and all(torch.isfinite(t).all() for t in tensors.values()), len(tensors))
    tally.notes.append(f"rerun of 4 steps after the kills: {time.monotonic() - start:.1f} s")
