"""Benchmark of a night's export on the embedded model: merge a rank-16 LoRA into the
float32 HF copy, save it, convert it to q8_0 GGUF, and verify the release.

    .venv/bin/python bench/export.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.converter import fetch_converter  # noqa: E402
from trainer.export import export_release, verify_release  # noqa: E402
from trainer.train import LORA_TARGETS  # noqa: E402

BASE = ROOT / "data/models/smollm2-135m-instruct-hf"


def make_adapter(out: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(BASE),
                           LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1e-3)
    model.save_pretrained(out)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        make_adapter(Path(tmp) / "adapter")
        converter = fetch_converter(ROOT / "data/cache")
        started = time.perf_counter()
        gguf = export_release(Path(tmp) / "adapter", BASE, Path(tmp) / "release", converter,
                              night=0, step=0)
        exported = time.perf_counter() - started
        started = time.perf_counter()
        verify_release(Path(tmp) / "release", BASE)
        verified = time.perf_counter() - started
        size = gguf.stat().st_size / 2**20
    print(f"export (merge float32 + save + q8_0 GGUF), SmolLM2-135M: {exported:.1f} s "
          f"({size:.0f} MiB GGUF); verify release checksums: {verified:.2f} s")


if __name__ == "__main__":
    main()
