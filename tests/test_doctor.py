"""`python -m bot doctor`: masked config, then a pass/fail line per part."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def doctor(config: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bot", "--config", str(config), "doctor"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, **env})


@pytest.mark.slow
def test_doctor_passes_every_check_and_masks_the_token(tmp_path, served_gguf, free_port):
    config = tmp_path / "config.toml"
    config.write_text(f'[model]\ngguf = "{served_gguf}"\n'
                      f'hf_dir = "{served_gguf.parent / "smollm2-135m-instruct-hf"}"\n'
                      f'[server]\nport = {free_port}\n[discord]\ntoken_env = "NS_DOCTOR_TOKEN"\n')
    done = doctor(config, NS_DOCTOR_TOKEN="tok-do-not-print-42")
    assert "tok-do-not-print-42" not in done.stdout + done.stderr
    assert 'token_env = "NS_DOCTOR_TOKEN"  # secret: set, value masked' in done.stdout
    for part in ("model files", "model pair", "server start and canary", "bubblewrap",
                 "chromadb and embedder", "disk space"):
        assert f"PASS  {part}:" in done.stdout, done.stdout
    assert done.returncode == 0


@pytest.mark.slow
def test_doctor_fails_a_corrupt_model_and_exits_nonzero(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all" * 100)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    config = tmp_path / "config.toml"
    config.write_text(f'[model]\ngguf = "{bad}"\nhf_dir = "{hf}"\n[server]\nstart_timeout_s = 30\n')
    done = doctor(config)
    assert "FAIL  model files:" in done.stdout
    assert "FAIL  model pair:" in done.stdout
    assert "FAIL  server start and canary:" in done.stdout
    assert "PASS  disk space:" in done.stdout
    assert done.returncode == 1


# -- the model pair (no server: metadata only) ----------------------------------------


def embedded_hf(served_gguf: Path) -> Path:
    return served_gguf.parent / "smollm2-135m-instruct-hf"


def copy_hf(source: Path, to: Path, **config_changes) -> Path:
    """The small files of an HF checkpoint (config, tokenizer), config.json edited."""
    import json
    import shutil

    to.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(source / name, to / name)
    config = json.loads((to / "config.json").read_text())
    config.update(config_changes)
    (to / "config.json").write_text(json.dumps(config))
    return to


def test_the_embedded_pair_matches(served_gguf):
    from bot.model_pair import check_pair

    ok, detail = check_pair(served_gguf, embedded_hf(served_gguf))
    assert ok, detail
    assert "llama, 30 layers, 49152 tokens in both" in detail and "own chat template" in detail


def test_another_architecture_or_shape_is_named(served_gguf, tmp_path):
    from bot.model_pair import check_pair

    other = copy_hf(embedded_hf(served_gguf), tmp_path / "qwen", model_type="qwen2",
                    num_hidden_layers=2, hidden_size=64)
    ok, detail = check_pair(served_gguf, other)
    assert not ok and "not the same model" in detail
    assert "architecture: the GGUF is 'llama', the HF checkpoint is 'qwen2'" in detail
    assert "num_hidden_layers: the GGUF has 30, the HF checkpoint 2" in detail
    assert "hidden_size: the GGUF has 576, the HF checkpoint 64" in detail


def test_another_tokenizer_is_named_even_at_the_same_vocab_size(served_gguf, tmp_path):
    import json

    from bot.model_pair import check_pair

    other = copy_hf(embedded_hf(served_gguf), tmp_path / "tok")
    ok, detail = check_pair(served_gguf, copy_hf(other, tmp_path / "big", vocab_size=50000))
    assert not ok and "the GGUF has 49152 tokens, the HF checkpoint's vocab_size is 50000" in detail
    data = json.loads((other / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    shuffled = dict(zip(vocab, reversed(list(vocab.values()))))  # same size, other ids
    data["model"]["vocab"] = shuffled
    data["added_tokens"] = []
    (other / "tokenizer.json").write_text(json.dumps(data))
    ok, detail = check_pair(served_gguf, other)
    assert not ok and "sampled ids differ" in detail, detail


def test_doctor_runs_the_pair_check_on_the_configured_files(served_gguf, tmp_path):
    import asyncio

    from core.config import Config
    from bot.doctor import check_model_pair

    config = Config()
    config.model.gguf = served_gguf
    config.model.hf_dir = copy_hf(embedded_hf(served_gguf), tmp_path / "q", model_type="qwen2")
    ok, detail = asyncio.run(check_model_pair(config))
    assert not ok and "'qwen2'" in detail
    config.model.hf_dir = tmp_path / "nowhere"
    assert asyncio.run(check_model_pair(config)) == (
        False, "needs both model files (see the line above)")
