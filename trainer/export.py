"""Export: a night's LoRA as a release the server can load, with its accounts.

Merged (default): the adapter is merged into the float32 base
(``merge_and_unload``), saved as safetensors, and converted to q8_0 GGUF with
llama.cpp's own ``convert_hf_to_gguf.py`` (from the llama-cpp-python sdist).
The merge is done in float32 and saved in float32: bfloat16 would keep only
part of a night's 0.1-0.2% change, and a 4-bit GGUF would erase it. The merged
checkpoint is the base of the next night.

Adapter-only: the adapter is converted with ``convert_lora_to_gguf.py`` and
served on top of the base GGUF with ``--lora_path``.

Either way the release directory holds the plain PEFT adapter
(``adapter_config.json``, ``adapter_model.safetensors``), which loads with
transformers + peft alone, and ``release.json``: the base model, a checksum of
the tokenizer and chat template, the PEFT settings, the dtype, the night, the
step, and the SHA-256 of every file including the GGUF. ``verify_release``
refuses a release whose checksums or settings do not match.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from serving.releases import adapter_base_matches, sha256_file
from trainer.converter import convert_hf_to_gguf, convert_lora_to_gguf

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")
MERGED_DTYPE = "float32"


class ReleaseError(RuntimeError):
    """A release is incomplete, corrupt or does not fit its base."""


def tokenizer_checksum(model_dir: Path) -> str:
    """One hash over the tokenizer and chat template files a model directory has."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def export_release(adapter_dir: Path, base_dir: Path, release_dir: Path, converter: Path, *,
                   night: int, step: int, mode: str = "merged",
                   base_gguf: Path | None = None) -> Path:
    """Build ``release_dir`` from a trained adapter; returns the GGUF to serve."""
    if mode not in ("merged", "adapter"):
        raise ReleaseError(f"export mode {mode!r} is unknown: use merged or adapter")
    for name in ADAPTER_FILES:
        if not (adapter_dir / name).is_file():
            raise ReleaseError(f"{adapter_dir} has no {name}: the training did not finish")
    partial = release_dir.with_name(release_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in ADAPTER_FILES:
        shutil.copy2(adapter_dir / name, partial / name)
    serve: dict
    if mode == "merged":
        merged = _merge(adapter_dir, base_dir, partial / "merged")
        gguf = convert_hf_to_gguf(converter, merged, partial / "model-q8_0.gguf", "q8_0")
        serve = {"gguf": gguf.name}
    else:
        if base_gguf is None:
            raise ReleaseError("adapter-only export needs the base GGUF it will be served on")
        gguf = convert_lora_to_gguf(converter, adapter_dir, base_dir, partial / "adapter-f16.gguf")
        serve = {"gguf": str(base_gguf), "lora": gguf.name}
    peft_settings = json.loads((adapter_dir / "adapter_config.json").read_text())
    meta = {
        "format": 1, "mode": mode, "night": night, "step": step, "created_at": time.time(),
        "base_model": str(base_dir), "base_tokenizer_sha256": tokenizer_checksum(base_dir),
        "dtype": MERGED_DTYPE if mode == "merged" else "adapter",
        "peft": {k: peft_settings.get(k) for k in ("peft_type", "r", "lora_alpha",
                                                    "target_modules", "lora_dropout")},
        "serve": serve,
        # Adapter mode serves on a GGUF outside the release: its hash anchors which one.
        "base_gguf_sha256": sha256_file(Path(base_gguf)) if mode == "adapter" else None,
    }
    seal(partial, release_dir, meta)
    return serve_paths(release_dir)[0]


def seal(partial: Path, release_dir: Path, meta: dict) -> None:
    """Hash every file of ``partial`` into its release.json, then rename it into place.

    The rename is the one step that makes a release exist: a process killed before it
    leaves only ``*.partial`` (rebuilt by the next export), and after it a whole release
    (bench/reliability.py's ``release-kill`` kills it at random moments)."""
    meta = {**meta, "files": {str(p.relative_to(partial)): sha256_file(p)
                              for p in sorted(partial.rglob("*")) if p.is_file()}}
    (partial / "release.json").write_text(json.dumps(meta, indent=1, default=_jsonable))
    shutil.rmtree(release_dir, ignore_errors=True)
    os.replace(partial, release_dir)


def _merge(adapter_dir: Path, base_dir: Path, out: Path) -> Path:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(out), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(base_dir)).save_pretrained(str(out))
    return out


def _jsonable(value: object) -> object:
    return sorted(value) if isinstance(value, (set, frozenset)) else str(value)


def serve_paths(release_dir: Path) -> tuple[Path, Path | None]:
    """(GGUF to serve, LoRA GGUF or None) of a release."""
    serve = json.loads((release_dir / "release.json").read_text())["serve"]
    gguf = Path(serve["gguf"])
    gguf = gguf if gguf.is_absolute() else release_dir / gguf
    lora = release_dir / serve["lora"] if serve.get("lora") else None
    return gguf, lora


def verify_release(release_dir: Path, base_dir: Path | None = None) -> dict:
    """release.json, checked against every file and (optionally) the base; raises ReleaseError."""
    path = release_dir / "release.json"
    if not path.is_file():
        raise ReleaseError(f"{release_dir} has no release.json: not a release")
    try:
        meta = json.loads(path.read_text())
    except ValueError as exc:
        raise ReleaseError(f"{path} is not valid JSON: {exc}") from None
    for name, expected in meta.get("files", {}).items():
        file = release_dir / name
        if not file.is_file():
            raise ReleaseError(f"release {release_dir.name}: {name} is missing")
        if sha256_file(file) != expected:
            raise ReleaseError(f"release {release_dir.name}: {name} does not match its "
                               "SHA-256 in release.json (corrupt or changed); refusing it")
    serve = meta.get("serve", {})
    own = serve.get("lora") if meta.get("mode") == "adapter" else serve.get("gguf")
    missing = [n for n in (*ADAPTER_FILES, own) if n not in meta.get("files", {})]
    if missing:
        raise ReleaseError(f"release {release_dir.name} does not account for {missing}")
    if meta.get("mode") == "adapter" and not adapter_base_matches(meta):
        raise ReleaseError(f"release {release_dir.name}: the base GGUF {serve.get('gguf')} it "
                           "is served on is missing or not the one it was exported for")
    if base_dir is not None and meta.get("base_tokenizer_sha256") != tokenizer_checksum(base_dir):
        raise ReleaseError(f"release {release_dir.name} was trained on another tokenizer or chat "
                           f"template than {base_dir}; refusing it")
    adapter = json.loads((release_dir / "adapter_config.json").read_text())
    if adapter.get("r") != meta["peft"]["r"] or adapter.get("lora_alpha") != meta["peft"]["lora_alpha"]:
        raise ReleaseError(f"release {release_dir.name}: adapter settings differ from release.json")
    return meta
