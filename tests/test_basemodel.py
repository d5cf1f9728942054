"""The embedded model's HF copy and its q8_0 conversion through llama.cpp's converter."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainer.basemodel import BaseModelError, make_hf_copy
from trainer.converter import convert_hf_to_gguf, fetch_converter

ROOT = Path(__file__).resolve().parents[1]
HF_COPY = ROOT / "data/models/smollm2-135m-instruct-hf"


def test_bfloat16_copies_are_refused(tmp_path):
    with pytest.raises(BaseModelError, match="never bfloat16"):
        make_hf_copy(tmp_path / "x.gguf", tmp_path / "out", dtype="bfloat16")


def test_hf_copy_is_float32_with_the_chat_template(served_gguf):
    config = json.loads((HF_COPY / "config.json").read_text())
    assert config["dtype"] == "float32"
    assert "quantization_config" not in config
    from safetensors import safe_open

    with safe_open(HF_COPY / "model.safetensors", "np") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"F32"}
    assert "<|im_start|>" in (HF_COPY / "chat_template.jinja").read_text()


@pytest.mark.slow
def test_served_q8_0_gguf_matches_the_hf_copy(served_gguf):
    import torch
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(HF_COPY)
    model = AutoModelForCausalLM.from_pretrained(HF_COPY)
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        hf_logits = model(ids).logits[0, -1].numpy()
    llm = Llama(str(served_gguf), n_ctx=256, logits_all=True, verbose=False)
    llm.eval(ids[0].tolist())
    gguf_logits = np.array(llm.scores[ids.shape[1] - 1])
    assert np.corrcoef(hf_logits, gguf_logits)[0, 1] > 0.99
    assert hf_logits.argmax() == gguf_logits.argmax()


@pytest.mark.slow
def test_converter_turns_a_tiny_hf_model_into_a_loadable_q8_0_gguf(tmp_path, served_gguf):
    import torch
    from llama_cpp import Llama
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(HF_COPY)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=len(tok), tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    conv = fetch_converter(ROOT / "data/cache")
    out = convert_hf_to_gguf(conv, tmp_path / "tiny", tmp_path / "tiny-q8_0.gguf")
    assert out.read_bytes()[:4] == b"GGUF"
    llm = Llama(str(out), n_ctx=64, verbose=False)
    assert llm.n_vocab() == len(tok)
