"""Export: a release directory with a plain PEFT adapter, a q8_0 GGUF and checksums."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.converter import fetch_converter
from trainer.export import ReleaseError, export_release, verify_release

ROOT = Path(__file__).resolve().parents[1]
HF_COPY = ROOT / "data/models/smollm2-135m-instruct-hf"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama with SmolLM2's tokenizer, and a LoRA adapter with real weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(HF_COPY)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tok),
                         tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    model = get_peft_model(LlamaForCausalLM.from_pretrained(root / "base"),
                           LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)  # a non-zero change, as after training
    model.save_pretrained(root / "adapter")
    return root


@pytest.mark.slow
def test_merged_release_verifies_and_a_tampered_file_is_refused(tiny, tmp_path):
    release = tmp_path / "night-0001"
    gguf = export_release(tiny / "adapter", tiny / "base", release,
                          fetch_converter(ROOT / "data/cache"), night=1, step=3)
    assert gguf == release / "model-q8_0.gguf" and gguf.read_bytes()[:4] == b"GGUF"
    meta = verify_release(release, tiny / "base")
    assert meta["dtype"] == "float32" and meta["peft"]["r"] == 16 and meta["night"] == 1
    assert set(meta["files"]) >= {"adapter_config.json", "adapter_model.safetensors",
                                  "model-q8_0.gguf", "merged/model.safetensors"}
    data = bytearray(gguf.read_bytes())
    data[-100] ^= 0xFF
    gguf.write_bytes(bytes(data))
    with pytest.raises(ReleaseError, match="model-q8_0.gguf does not match its SHA-256"):
        verify_release(release)


@pytest.mark.slow
def test_the_release_adapter_loads_with_transformers_and_peft_alone(tiny, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    release = tmp_path / "r"
    export_release(tiny / "adapter", tiny / "base", release, fetch_converter(ROOT / "data/cache"),
                   night=2, step=1)
    base = AutoModelForCausalLM.from_pretrained(tiny / "base")
    plain = base(torch.tensor([[1, 2, 3]])).logits
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny / "base"), release)
    assert not torch.allclose(plain, tuned(torch.tensor([[1, 2, 3]])).logits)
    merged = AutoModelForCausalLM.from_pretrained(release / "merged")
    assert torch.allclose(merged(torch.tensor([[1, 2, 3]])).logits,
                          tuned(torch.tensor([[1, 2, 3]])).logits, atol=1e-4)


def test_a_release_for_another_tokenizer_or_with_changed_settings_is_refused(tiny, tmp_path):
    release = tmp_path / "r"
    release.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (release / name).write_bytes((tiny / "adapter" / name).read_bytes())
    from trainer.export import sha256_file

    meta = {"mode": "merged", "serve": {"gguf": "adapter_model.safetensors"},
            "base_tokenizer_sha256": "0" * 64,
            "peft": {"r": 16, "lora_alpha": 32},
            "files": {n: sha256_file(release / n) for n in ("adapter_config.json",
                                                            "adapter_model.safetensors")}}
    (release / "release.json").write_text(json.dumps(meta))
    with pytest.raises(ReleaseError, match="another tokenizer"):
        verify_release(release, tiny / "base")
    meta["peft"]["r"] = 8
    meta["base_tokenizer_sha256"] = None
    (release / "release.json").write_text(json.dumps(meta))
    with pytest.raises(ReleaseError, match="adapter settings differ"):
        verify_release(release)
    with pytest.raises(ReleaseError, match="not a release"):
        verify_release(tmp_path)


@pytest.mark.slow
def test_adapter_only_release_serves_the_lora_on_top_of_the_base_gguf(tiny, tmp_path):
    from llama_cpp import Llama

    from trainer.converter import convert_hf_to_gguf

    converter = fetch_converter(ROOT / "data/cache")
    base_gguf = convert_hf_to_gguf(converter, tiny / "base", tmp_path / "base-f16.gguf", "f16")
    release = tmp_path / "adapter-release"
    served = export_release(tiny / "adapter", tiny / "base", release, converter, night=3, step=1,
                            mode="adapter", base_gguf=base_gguf)
    assert served == base_gguf
    meta = verify_release(release, tiny / "base")
    assert meta["mode"] == "adapter" and "adapter-f16.gguf" in meta["files"]
    prompt = [1, 2, 3, 4]
    plain = Llama(str(base_gguf), n_ctx=32, verbose=False, logits_all=True)
    plain.eval(prompt)
    tuned = Llama(str(base_gguf), lora_path=str(release / "adapter-f16.gguf"), n_ctx=32,
                  verbose=False, logits_all=True)
    tuned.eval(prompt)
    assert list(plain.scores[3]) != list(tuned.scores[3])  # the LoRA changes the logits
    # The base it is served on is anchored by its hash: another file there is refused.
    with open(base_gguf, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(ReleaseError, match="not the one it was exported for"):
        verify_release(release, tiny / "base")
