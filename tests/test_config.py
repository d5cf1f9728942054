"""Config: defaults, the documented example, and errors that name key, value and fix."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from core.config import Config, ConfigError, load_config, masked_dump

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_no_config_file_gives_embedded_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(None)
    assert config.server.kind == "llama-cpp-python"
    assert config.data_dir == tmp_path / "data"
    assert config.served_gguf == tmp_path / "data/models/smollm2-135m-instruct-q8_0.gguf"
    assert config.base_url == "http://127.0.0.1:8377/v1"


def test_example_file_documents_every_key_and_loads_as_defaults(tmp_path):
    example = ROOT / "config.example.toml"
    raw = tomllib.loads(example.read_text())
    for section, field in Config.model_fields.items():
        assert section in raw, f"[{section}] missing from config.example.toml"
        model = field.annotation
        assert set(raw[section]) == set(model.model_fields), f"[{section}] keys differ"
    lines = example.read_text().splitlines()
    for section, keys in raw.items():
        for key in keys:
            line = next(i for i, l in enumerate(lines) if l.startswith(f"{key} ="))
            # A key is documented by the comment above it or above its group of keys.
            while line > 0 and "=" in lines[line - 1] and not lines[line - 1].startswith("#"):
                line -= 1
            assert lines[line - 1].startswith("#"), f"{section}.{key} has no comment"
    config = load_config(example)
    defaults = Config()
    assert config.server == defaults.server
    assert config.agent == defaults.agent
    assert config.model.gguf is None and config.server.binary is None


def test_bad_value_error_names_key_value_and_fix(tmp_path):
    path = write(tmp_path, "[server]\nport = 99999\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "server.port" in message and "99999" in message and "Fix:" in message


def test_unknown_key_is_refused_with_the_valid_keys(tmp_path):
    path = write(tmp_path, "[server]\nprot = 1\n")
    with pytest.raises(ConfigError, match=r"server\.prot is not a known key.*port"):
        load_config(path)


def test_invalid_toml_is_refused_clearly(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[server\n"))


@pytest.mark.parametrize("endpoint", ["http://8.8.8.8:8080/v1", "http://1.1.1.1/v1"])
def test_public_model_endpoint_is_refused(tmp_path, endpoint):
    path = write(tmp_path, f'[server]\nkind = "external"\nendpoint = "{endpoint}"\n')
    with pytest.raises(ConfigError, match="not a loopback or private address"):
        load_config(path)


def test_private_endpoint_is_accepted(tmp_path):
    path = write(tmp_path, '[server]\nkind = "external"\nendpoint = "http://192.168.1.20:8080/v1"\n')
    assert load_config(path).base_url == "http://192.168.1.20:8080/v1"


def test_public_host_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="server.host"):
        load_config(write(tmp_path, '[server]\nhost = "8.8.4.4"\n'))


def test_a_secret_pasted_into_an_env_key_is_refused(tmp_path):
    path = write(tmp_path, '[discord]\ntoken_env = "MTIz.abc.def-ghi"\n')
    with pytest.raises(ConfigError, match="discord.token_env.*name of an environment variable"):
        load_config(path)


def test_relative_paths_resolve_against_the_config_directory(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/m.gguf").write_bytes(b"GGUF")
    path = write(tmp_path, '[paths]\ndata_dir = "state"\n[model]\ngguf = "sub/m.gguf"\n')
    monkeypatch.chdir("/")
    config = load_config(path)
    assert config.data_dir == tmp_path / "state"
    assert config.served_gguf == tmp_path / "sub/m.gguf"


def test_a_configured_checkpoint_must_exist(tmp_path):
    path = write(tmp_path, '[model]\nhf_dir = "nowhere"\ngguf = "missing.gguf"\n')
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "model.hf_dir" in str(err.value) and "model.gguf" in str(err.value)


def test_masked_dump_never_shows_the_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("NS_TEST_TOKEN", "very-secret-value-123")
    config = load_config(write(tmp_path, '[discord]\ntoken_env = "NS_TEST_TOKEN"\n'))
    assert config.secret("discord.token_env") == "very-secret-value-123"
    assert config.secret_values() == ["very-secret-value-123"]
    dump = masked_dump(config)
    assert "very-secret-value-123" not in dump
    assert "secret: set" in dump


def test_cli_exits_nonzero_on_bad_config_before_starting_anything(tmp_path):
    path = write(tmp_path, "[watchdog]\ninterval_s = -1\n")
    done = subprocess.run([sys.executable, "-m", "bot", "--config", str(path), "run"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2
    assert "watchdog.interval_s" in done.stderr and "Fix:" in done.stderr
    assert not (tmp_path / "data").exists()


def test_a_renamed_key_keeps_working_under_its_old_name_with_a_warning(tmp_path, caplog):
    config = load_config(write(tmp_path, "[agent]\nhistory_messages = 7\n"))
    assert config.agent.history_steps == 7
    assert "history_messages is deprecated; rename it to history_steps" in caplog.text


def test_a_renamed_key_given_under_both_names_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="keep only history_steps"):
        load_config(write(tmp_path, "[agent]\nhistory_messages = 7\nhistory_steps = 8\n"))
