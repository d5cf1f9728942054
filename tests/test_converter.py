"""llama.cpp's converter is taken from a pinned sdist and run without the bot's secrets."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from trainer import converter
from trainer.converter import ConverterError, fetch_converter


def test_the_converter_runs_without_the_bots_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DISCORD_TOKEN", "secret-token")
    monkeypatch.setenv("PATH", "/usr/bin")
    env = converter._env(tmp_path)
    assert "DISCORD_TOKEN" not in env and "secret-token" not in env.values()
    assert env["PATH"] == "/usr/bin" and env["HF_HUB_OFFLINE"] == "1"
    assert env["PYTHONPATH"].startswith(str(tmp_path / "gguf-py"))


def test_an_unpinned_version_is_refused_before_anything_is_fetched(tmp_path):
    with pytest.raises(ConverterError, match="no known SHA-256 for the llama-cpp-python 9.9.9"):
        fetch_converter(tmp_path, "9.9.9")
    assert not (tmp_path / "llama.cpp-converter-9.9.9").exists()


def test_an_sdist_whose_hash_differs_is_never_extracted(monkeypatch, tmp_path):
    """pip checks the hash itself (--require-hashes); a download that got past it anyway
    is checked again before one file of it is extracted."""
    calls = []

    def fake_pip(cmd, **kwargs):
        calls.append(cmd)
        out = Path(cmd[cmd.index("-d") + 1])
        (out / "llama_cpp_python-0.3.36.tar.gz").write_bytes(b"not the pinned sdist")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(converter.subprocess, "run", fake_pip)
    with pytest.raises(ConverterError, match="is not the sdist pinned for 0.3.36"):
        fetch_converter(tmp_path, "0.3.36")
    assert "--require-hashes" in calls[0]
    assert not (tmp_path / "llama.cpp-converter-0.3.36").exists()
