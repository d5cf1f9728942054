"""The sections of config.toml, one typed class each.

Every field's description is the fix a validation error suggests ("set it to
..."), so it reads as the kind of value wanted. ``core.config`` assembles them
into ``Config`` and loads the file.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from pathlib import Path
from typing import ClassVar, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

EMBEDDED_MODEL = "SmolLM2-135M-Instruct"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(Exception):
    """A config problem the user must fix; the message says key, value and fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    # Keys renamed since a release: old name -> new name. The old name keeps working,
    # with a warning that names the fix, so an existing config.toml still starts.
    _renamed: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: object) -> object:
        if not isinstance(data, dict) or not cls._renamed:
            return data
        data = dict(data)
        for old, new in cls._renamed.items():
            if old not in data:
                continue
            if new in data:
                raise ValueError(f"{old} and {new} are the same setting ({old} is its old "
                                 f"name); keep only {new}")
            logging.getLogger("nightshift.config").warning(
                "config key %s is deprecated; rename it to %s", old, new)
            data[new] = data.pop(old)
        return data


def _empty_is_none(value: object) -> object:
    # TOML has no null; the example file writes "" for "not set".
    return None if value == "" else value


class PathsConfig(_Section):
    data_dir: Path = Field(
        Path("data"),
        description="where the store, workspaces, models and releases live; "
        "use a writable directory",
    )


class ModelConfig(_Section):
    gguf: Path | None = Field(
        None,
        description="a GGUF file to serve; leave empty for the embedded model's q8_0 "
        "conversion, or point it at an existing .gguf file",
    )
    hf_dir: Path | None = Field(
        None,
        description="the HF checkpoint the trainer starts from; leave empty for the "
        "embedded model's HF copy, or point it at a directory with config.json",
    )
    _unset = field_validator("gguf", "hf_dir", mode="before")(_empty_is_none)

    alias: str = Field("nightshift", min_length=1, description="a non-empty model name")
    context_tokens: int = Field(
        8192, ge=512, le=131072, description="a context size between 512 and 131072"
    )
    vision: bool = Field(
        False, description="true only for a model that accepts images (view_image attaches them)"
    )
    chat_format: str = Field(
        "auto",
        min_length=1,
        description="auto (chosen from the GGUF's chat template; `python -m bot doctor` "
        "says which and why) or a llama_cpp.server chat format, e.g. chatml-function-calling",
    )


class ServerConfig(_Section):
    kind: Literal["llama-cpp-python", "llama-server", "external"] = Field(
        "llama-cpp-python",
        description="one of llama-cpp-python, llama-server or external",
    )
    host: str = Field("127.0.0.1", description="a loopback or private address, e.g. 127.0.0.1")
    port: int = Field(8377, ge=1, le=65535, description="a free TCP port between 1 and 65535")
    endpoint: str = Field(
        "",
        description="for kind=external, the server's OpenAI base URL on a loopback or "
        "private address, e.g. http://127.0.0.1:8080/v1",
    )
    binary: Path | None = Field(
        None, description="for kind=llama-server, the path of the llama-server binary"
    )
    _unset = field_validator("binary", mode="before")(_empty_is_none)

    threads: int = Field(0, ge=0, description="0 for llama.cpp's default, or a positive count")
    prompt_cache_mb: int = Field(
        1024, ge=0, description="MiB of RAM for saved prompt states (llama-cpp-python); 0 = off"
    )
    extra_args: list[str] = Field(
        default_factory=list, description="a list of extra command-line arguments"
    )
    start_timeout_s: float = Field(
        180, gt=0, description="seconds to wait for the server to become ready (> 0)"
    )
    stop_grace_s: float = Field(
        10, gt=0, description="seconds between SIGTERM and SIGKILL on stop (> 0)"
    )
    request_timeout_s: float = Field(
        300, gt=0, description="seconds one chat request may take (> 0)"
    )

    @field_validator("host")
    @classmethod
    def _host_is_local(cls, host: str) -> str:
        _require_local(host)
        return host

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_local(cls, endpoint: str) -> str:
        if endpoint:
            parsed = urlparse(endpoint)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise ValueError("must be an http(s) URL such as http://127.0.0.1:8080/v1")
            _require_local(parsed.hostname)
        return endpoint


class WatchdogConfig(_Section):
    interval_s: float = Field(15, gt=0, description="seconds between canaries (> 0)")
    canary_timeout_s: float = Field(
        20, gt=0, description="seconds a canary completion may take (> 0)"
    )
    failures_before_restart: int = Field(
        3, ge=1, description="consecutive canary failures before a restart (>= 1)"
    )
    restart_cooldown_s: float = Field(
        30, ge=0, description="minimum seconds between two restarts (>= 0)"
    )


class DiscordConfig(_Section):
    token_env: str = Field(
        "DISCORD_TOKEN",
        description="the NAME of the environment variable holding the bot token",
    )
    admin_user_ids: list[int] = Field(default_factory=list, description="a list of user ids")
    admin_role_ids: list[int] = Field(default_factory=list, description="a list of role ids")
    allowed_channel_ids: list[int] = Field(
        default_factory=list, description="a list of channel ids (empty = every channel)"
    )
    blocked_channel_ids: list[int] = Field(default_factory=list, description="a list of channel ids")
    allowed_user_ids: list[int] = Field(
        default_factory=list, description="a list of user ids (empty = everyone)"
    )
    blocked_user_ids: list[int] = Field(default_factory=list, description="a list of user ids")
    allowed_role_ids: list[int] = Field(
        default_factory=list, description="a list of role ids (empty = every role)"
    )
    blocked_role_ids: list[int] = Field(default_factory=list, description="a list of role ids")
    require_mention: bool = Field(
        True, description="true or false: in server channels, answer only when mentioned"
    )
    no_mention_channel_ids: list[int] = Field(
        default_factory=list, description="a list of channel ids that need no mention"
    )
    allow_dms: bool = Field(
        False, description="true or false: answer direct messages (they follow the allow lists)"
    )
    command_prefix: str = Field("!", min_length=1, max_length=3, description="1-3 characters, e.g. !")
    status_after_s: float = Field(
        10, ge=0,
        description="seconds a turn runs before a status message shows its current step "
                    "(>= 0; 0 = never)",
    )

    @field_validator("token_env")
    @classmethod
    def _env_name(cls, name: str) -> str:
        return _check_env_name(name)


class AgentConfig(_Section):
    _renamed: ClassVar[dict[str, str]] = {"history_messages": "history_steps"}

    system_prompt: str = Field(
        "You are Nightshift, a helpful assistant working in a Discord channel. "
        "Answer concisely.",
        min_length=1,
        description="a non-empty base system prompt",
    )
    history_steps: int = Field(
        20, ge=0,
        description="how many earlier steps of the channel (messages, tool calls and tool "
                    "results) to include (>= 0)",
    )
    max_reply_tokens: int = Field(512, ge=1, description="a positive token count")
    tools: Literal["auto", "all"] | list[str] = Field(
        "auto",
        description='"auto" (a small core set for the embedded model, every tool for '
                    'another model), "all", or a list of tool names',
    )
    shared_notes_channels: list[str] = Field(
        default_factory=list,
        description="channel keys (a Discord channel id, a console name, dm-<user id>) whose "
                    "agent may read and write the notes shared between channels",
    )
    clear_scratch_after_turn: bool = Field(
        False, description="true to empty the workspace's scratch/ at the end of each turn"
    )
    max_steps: int = Field(
        8, ge=1, le=100, description="model calls allowed in one turn (1..100)"
    )
    max_format_errors: int = Field(
        3, ge=1, description="malformed tool calls in a row before the turn ends (>= 1)"
    )
    repeat_limit: int = Field(
        3, ge=2,
        description="the same tool call with the same arguments and result this many times "
                    "in a turn ends tool use for the turn: the model must answer (>= 2)",
    )
    tool_output_chars: int = Field(
        4000, ge=200, description="characters of one tool output kept in context (>= 200)"
    )
    keep_recent_messages: int = Field(
        8, ge=2, description="recent messages kept verbatim when compacting (>= 2)"
    )
    queue_size: int = Field(
        16, ge=1, description="messages waiting per channel before 'busy' replies (>= 1)"
    )
    temperature: float = Field(
        0.3, ge=0, le=2, description="a sampling temperature between 0 and 2"
    )


class SandboxConfig(_Section):
    allow_unsandboxed: bool = Field(
        False, description="true or false; true runs code without bubblewrap (unsafe)"
    )
    workspace_quota_mb: int = Field(
        1024, ge=1, description="disk each channel's workspace may use, in MiB (>= 1)"
    )
    total_memory_mb: int = Field(
        4096, ge=64, description="memory all sandboxed programs may use together, in MiB (>= 64)"
    )
    max_jobs_per_channel: int = Field(
        2, ge=0, description="background Python jobs running at once in one channel (>= 0)"
    )
    max_jobs_total: int = Field(
        4, ge=0, description="background Python jobs running at once over all channels (>= 0)"
    )



class DiskConfig(_Section):
    """The data folder's disk: one budget for all of it, and the shares of it one channel
    and one person may take (``sandbox.disk_budget``)."""

    budget_mb: int = Field(
        0, ge=0,
        description="MiB the whole data folder may use (>= 0; 0 = automatic: what it uses at "
                    "start plus nine tenths of the disk's free space)",
    )
    channel_share_percent: float = Field(
        25, gt=0, le=100,
        description="the percent of the budget one channel (its workspace and undo copies) "
                    "may use (> 0, <= 100)",
    )
    user_share_percent: float = Field(
        50, gt=0, le=100,
        description="the percent of the budget one person's channels (their DM, the threads "
                    "they started) may use together (> 0, <= 100)",
    )
    max_workspaces: int = Field(
        1000, ge=1, description="channel workspaces kept on disk at most (>= 1)"
    )
    keep_practice_workspaces: int = Field(
        100, ge=0,
        description="judged practice and self-play workspaces kept for inspection; older ones "
                    "are removed (>= 0)",
    )
    image_cache_mb: int = Field(
        512, ge=1, description="MiB the cache of viewed images may use (>= 1)"
    )
    refresh_s: float = Field(
        60, gt=0, description="seconds between two measurements of the data folder (> 0)"
    )

def _check_env_name(name: str) -> str:
    if not _ENV_NAME.match(name):
        raise ValueError(
            "must be the name of an environment variable (letters, digits, _), "
            "not the secret itself"
        )
    return name


def _require_local(host: str) -> None:
    """Refuse hosts that resolve to anything but loopback or private addresses."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise ValueError(f"cannot be resolved ({exc.strerror})") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if not (address.is_loopback or address.is_private):
            raise ValueError(
                f"resolves to {address}, which is not a loopback or private address; "
                "the model must run on this machine or your private network"
            )
