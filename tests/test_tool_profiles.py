"""agent.tools as a profile: "auto" by model, "all", or an explicit list."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.agent.tool_profiles import CORE_TOOLS, is_embedded, tool_names
from bot.runtime import _registry
from core.config import Config, ConfigError
from tools import default_registry

EVERY = default_registry().names()


def config(tools="auto", **model) -> Config:
    c = Config()
    c.paths.data_dir = Path("/srv/ns")
    c.agent.tools = tools
    for key, value in model.items():
        setattr(c.model, key, Path(value))
    return c


def test_auto_gives_the_embedded_model_the_core_set():
    c = config()
    assert is_embedded(c) and tool_names(c, EVERY) == list(CORE_TOOLS)
    assert set(CORE_TOOLS) <= set(EVERY) and len(CORE_TOOLS) < len(EVERY)
    # the embedded GGUF named explicitly (as the tests do) is still the embedded model
    assert tool_names(config(gguf="/srv/ns/models/smollm2-135m-instruct-q8_0.gguf"), EVERY) \
        == list(CORE_TOOLS)
    assert [s["function"]["name"] for s in _registry(c).schemas()] == list(CORE_TOOLS)


def test_auto_gives_a_model_of_your_own_every_tool():
    assert tool_names(config(hf_dir="/models/Qwen2.5-1.5B"), EVERY) == EVERY
    assert tool_names(config(gguf="/models/other.gguf"), EVERY) == EVERY


def test_all_and_explicit_lists_ignore_the_model():
    assert tool_names(config("all"), EVERY) == EVERY
    assert tool_names(config([]), EVERY) == EVERY  # the old spelling of "all"
    assert tool_names(config(["grep", "read_file"]), EVERY) == ["grep", "read_file"]
    with pytest.raises(ConfigError, match=r"\['nope'\] names unknown tools"):
        tool_names(config(["grep", "nope"]), EVERY)


def test_a_bad_profile_name_is_refused_by_the_config():
    with pytest.raises(Exception, match="tools"):
        Config.model_validate({"agent": {"tools": "some"}})
    assert Config.model_validate({"agent": {"tools": "all"}}).agent.tools == "all"
    assert Config().agent.tools == "auto"
