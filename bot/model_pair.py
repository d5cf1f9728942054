"""Does the served GGUF match the HF checkpoint the night trains?

The bot serves ``model.gguf`` and the trainer starts from ``model.hf_dir``; a
night's release is the HF checkpoint plus a LoRA, converted back to GGUF. If
the two are different models, the night trains one model on another's
tokens: the log-probs are garbage and nothing says so. So ``doctor`` compares
what both files say about themselves, without torch or transformers:

- architecture: GGUF ``general.architecture`` vs config.json ``model_type``;
- shape: ``<arch>.block_count`` / ``<arch>.embedding_length`` vs
  ``num_hidden_layers`` / ``hidden_size``;
- tokenizer: the GGUF's token list vs config.json ``vocab_size`` and, where the
  checkpoint has a tokenizer.json, the tokens themselves at sampled ids.

The GGUF is memory-mapped by the ``gguf`` package (metadata only; no tensor is
read). It is the user's own configured file, read off the event loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# HF model_type -> the GGUF architecture llama.cpp's converter writes for it, where the
# names differ; any other model_type is expected to be its own GGUF name.
GGUF_ARCH = {"mistral": "llama", "mixtral": "llama", "granite": "granite",
             "gemma3_text": "gemma3", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}
SAMPLED_IDS = 64


@dataclass
class GGUFFacts:
    architecture: str
    block_count: int | None
    embedding_length: int | None
    tokens: list[str]
    chat_template: str | None


def read_gguf(path: Path) -> GGUFFacts:
    from gguf import GGUFReader  # numpy only; loaded when doctor runs

    reader = GGUFReader(str(path))

    def value(key: str):
        field = reader.fields.get(key)
        return None if field is None else field.contents()

    arch = value("general.architecture") or "?"
    return GGUFFacts(arch, value(f"{arch}.block_count"), value(f"{arch}.embedding_length"),
                     value("tokenizer.ggml.tokens") or [], value("tokenizer.chat_template"))


def compare(gguf: GGUFFacts, hf_dir: Path) -> list[str]:
    """Mismatches between the GGUF and the HF checkpoint, as sentences; empty = a pair."""
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    config = config.get("text_config", config)  # multimodal checkpoints nest the LM's config
    problems = []
    model_type = str(config.get("model_type", "?"))
    if GGUF_ARCH.get(model_type, model_type) != gguf.architecture:
        problems.append(f"architecture: the GGUF is {gguf.architecture!r}, the HF checkpoint "
                        f"is {model_type!r}")
    for key, mine in (("num_hidden_layers", gguf.block_count),
                      ("hidden_size", gguf.embedding_length)):
        if mine is not None and key in config and int(config[key]) != int(mine):
            problems.append(f"{key}: the GGUF has {mine}, the HF checkpoint {config[key]}")
    vocab = config.get("vocab_size")
    if vocab is not None and gguf.tokens and int(vocab) != len(gguf.tokens):
        problems.append(f"tokenizer: the GGUF has {len(gguf.tokens)} tokens, the HF "
                        f"checkpoint's vocab_size is {vocab}")
    problems += _token_mismatches(gguf.tokens, hf_dir / "tokenizer.json")
    return problems


def _token_mismatches(tokens: list[str], tokenizer_json: Path) -> list[str]:
    """Same vocabulary size is not the same tokenizer: compare tokens at sampled ids."""
    if not tokens or not tokenizer_json.is_file():
        return []
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    by_id = {i: t for t, i in (data.get("model", {}).get("vocab") or {}).items()}
    by_id.update({a["id"]: a["content"] for a in data.get("added_tokens", [])})
    if not by_id:
        return []
    step = max(1, len(tokens) // SAMPLED_IDS)
    wrong = [i for i in range(0, len(tokens), step) if i in by_id and by_id[i] != tokens[i]]
    if not wrong:
        return []
    i = wrong[0]
    return [f"tokenizer: {len(wrong)} of {len(range(0, len(tokens), step))} sampled ids differ "
            f"(id {i}: the GGUF has {tokens[i]!r}, tokenizer.json {by_id[i]!r})"]


def check_pair(gguf_path: Path, hf_dir: Path) -> tuple[bool, str]:
    facts = read_gguf(gguf_path)
    problems = compare(facts, hf_dir)
    if problems:
        return False, ("model.gguf and model.hf_dir are not the same model: "
                       + "; ".join(problems) + ". Fix: point both at one model "
                       "(convert the HF checkpoint with `python -m trainer setup`)")
    template = "its own chat template" if facts.chat_template else "no chat template"
    return True, (f"{facts.architecture}, {facts.block_count} layers, {len(facts.tokens)} "
                  f"tokens in both; the GGUF carries {template}")
