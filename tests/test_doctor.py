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
    for part in ("model files", "server start and canary", "bubblewrap",
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
    assert "FAIL  server start and canary:" in done.stdout
    assert "PASS  disk space:" in done.stdout
    assert done.returncode == 1
