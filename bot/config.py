"""The whole config.toml schema.

One readable file, typed per section. Every key is documented in
``config.example.toml``. Secrets never live in the file: a key ending in
``_env`` names the environment variable that holds the secret.

Relative paths are resolved against the directory of the config file; with no
config file, against the current working directory. An empty model path means
"the embedded model", whose files live under ``paths.data_dir/models``.

Validation errors name the key, the bad value and the fix, and nothing starts
until the config is valid. This module stays free of discord and torch so the
trainer can import it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import tomllib
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

EMBEDDED_MODEL = "SmolLM2-135M-Instruct"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(Exception):
    """A config problem the user must fix; the message says key, value and fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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
        "chatml-function-calling",
        min_length=1,
        description="a llama_cpp.server chat format, e.g. chatml-function-calling",
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
    allow_dms: bool = Field(True, description="true or false: answer direct messages")
    command_prefix: str = Field("!", min_length=1, max_length=3, description="1-3 characters, e.g. !")

    @field_validator("token_env")
    @classmethod
    def _env_name(cls, name: str) -> str:
        return _check_env_name(name)


class AgentConfig(_Section):
    system_prompt: str = Field(
        "You are Nightshift, a helpful assistant working in a Discord channel. "
        "Answer concisely.",
        min_length=1,
        description="a non-empty base system prompt",
    )
    history_messages: int = Field(
        20, ge=0, description="how many earlier messages of the channel to include (>= 0)"
    )
    max_reply_tokens: int = Field(512, ge=1, description="a positive token count")
    tools: list[str] = Field(
        default_factory=list,
        description="a list of tool names the agent may use (empty = every tool)",
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


class NightConfig(_Section):
    eval_percent: int = Field(
        10, ge=0, le=50, description="the share of episodes held out for evaluation (0..50)"
    )
    window_messages: int = Field(10, ge=2, le=50, description="messages per judged window (2..50)")
    max_extends: int = Field(
        2, ge=0, le=10, description="how often the judge may extend a window (0..10)"
    )
    extend_limit: int = Field(
        10, ge=1, le=50, description="most messages one extend may add on each side (1..50)"
    )
    judge_attempts: int = Field(
        3, ge=1, le=10, description="tries for a parseable judge reply before skipping (1..10)"
    )
    judge_max_tokens: int = Field(512, ge=64, description="a token count >= 64")
    value_neighbours: int = Field(
        8, ge=1, le=50, description="past sub-tasks shown to the value model (1..50)"
    )
    half_life_days: float = Field(
        14, gt=0, description="days after which a memory counts half (> 0)"
    )
    length_scale: float = Field(
        10, gt=0, description="turns that make a length advantage of 1 (> 0)"
    )
    length_weight: float = Field(
        0.5, ge=0, description="weight of the length advantage beside the reward's (>= 0)"
    )
    understanding_fraction: float = Field(
        0.3, ge=0, le=1, description="share of episodes given the understanding pass (0..1)"
    )
    turn_penalty: float = Field(
        0.02, ge=0, description="advantage taken per extra assistant message in a turn (>= 0)"
    )
    stray_advantage: float = Field(
        -1.0, le=0, description="advantage on a stray end-of-turn's last token (<= 0)"
    )
    seed: int = Field(0, description="an integer seed for the night's samples")
    auto_promote: bool = Field(
        False, description="true to serve a candidate that passes the gate at once"
    )
    gate_margin: float = Field(
        0.05, description="how much better a candidate must score on held-out data"
    )
    regression_margin: float = Field(
        0.5, ge=0, description="how much worse open chat may score before it is a regression"
    )
    eval_max: int = Field(32, ge=1, description="held-out prompts evaluated per night (>= 1)")
    probes_file: Path | None = Field(
        None, description="a JSONL file of {\"prompt\", \"expected\"} verifiable probes, or empty"
    )
    export_mode: Literal["merged", "adapter"] = Field(
        "merged", description="merged (q8_0 GGUF of the merged model) or adapter (--lora_path)"
    )
    single_gpu: bool = Field(
        False, description="true to stop serving while training (one GPU too small for both)"
    )

    _unset = field_validator("probes_file", mode="before")(_empty_is_none)


class TrainConfig(_Section):
    beta: float = Field(0.1, gt=0, description="OAPL's beta (> 0); 1e-3 collapsed a prototype")
    echo_lambda: float = Field(0.05, ge=0, description="the ECHO loss weight (>= 0)")
    lr: float = Field(2e-4, gt=0, le=1e-2, description="a learning rate in (0, 0.01]")
    batch: int = Field(64, ge=1, description="sequences per optimizer step (>= 1)")
    micro_batch: int = Field(2, ge=1, description="sequences per forward pass (>= 1)")
    epochs: int = Field(1, ge=1, le=20, description="passes over the night's data (1..20)")
    steps: int = Field(0, ge=0, description="optimizer steps; 0 = as many as epochs need")
    max_tokens: int = Field(2048, ge=128, description="the longest training sequence (>= 128)")


class SandboxConfig(_Section):
    allow_unsandboxed: bool = Field(
        False, description="true or false; true runs code without bubblewrap (unsafe)"
    )


class Config(_Section):
    paths: PathsConfig = Field(default_factory=PathsConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    watchdog: WatchdogConfig = Field(default_factory=WatchdogConfig)
    discord: DiscordConfig = Field(default_factory=DiscordConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    night: NightConfig = Field(default_factory=NightConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)

    # Where the config came from; None means embedded defaults.
    _source: Path | None = PrivateAttr(None)

    @property
    def source(self) -> Path | None:
        return self._source

    @property
    def data_dir(self) -> Path:
        return self.paths.data_dir

    @property
    def models_dir(self) -> Path:
        return self.paths.data_dir / "models"

    @property
    def cache_dir(self) -> Path:
        return self.paths.data_dir / "cache"

    @property
    def store_path(self) -> Path:
        return self.paths.data_dir / "nightshift.db"

    @property
    def embedded_gguf(self) -> Path:
        return self.models_dir / "smollm2-135m-instruct-q8_0.gguf"

    @property
    def embedded_hf_dir(self) -> Path:
        return self.models_dir / "smollm2-135m-instruct-hf"

    @property
    def served_gguf(self) -> Path:
        return self.model.gguf or self.embedded_gguf

    @property
    def base_hf_dir(self) -> Path:
        return self.model.hf_dir or self.embedded_hf_dir

    @property
    def base_url(self) -> str:
        if self.server.kind == "external":
            return self.server.endpoint.rstrip("/")
        return f"http://{self.server.host}:{self.server.port}/v1"

    def secret(self, env_key: str) -> str | None:
        """The secret value named by a ``*_env`` key such as ``discord.token_env``."""
        section, key = env_key.split(".")
        name = getattr(getattr(self, section), key)
        return os.environ.get(name) or None

    def secret_values(self) -> list[str]:
        """Every configured secret's value, for masking and the night's secret scan."""
        values = [self.secret(key) for key in _env_keys(self)]
        return [v for v in values if v]


def _env_keys(config: Config) -> list[str]:
    keys = []
    for section_name in type(config).model_fields:
        section = getattr(config, section_name)
        if isinstance(section, BaseModel):
            keys += [f"{section_name}.{k}" for k in type(section).model_fields if k.endswith("_env")]
    return keys


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


# ---------------------------------------------------------------- loading


def load_config(path: Path | str | None = None) -> Config:
    """Load and validate a config file; ``None`` means embedded defaults.

    Raises ConfigError with one line per problem.
    """
    if path is None:
        config = Config()
        return _resolve_paths(config, Path.cwd())
    path = Path(path).expanduser().absolute()
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file. Fix: copy config.example.toml there.")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}. Fix: check the syntax there.") from None
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(path, exc)) from None
    config._source = path
    config = _resolve_paths(config, path.parent)
    _check_exists(config, path)
    return config


def _resolve_paths(config: Config, base: Path) -> Config:
    def resolve(p: Path | None) -> Path | None:
        if p is None:
            return None
        p = p.expanduser()
        return p if p.is_absolute() else (base / p).resolve()

    config.paths.data_dir = resolve(config.paths.data_dir)
    config.model.gguf = resolve(config.model.gguf)
    config.model.hf_dir = resolve(config.model.hf_dir)
    config.server.binary = resolve(config.server.binary)
    config.night.probes_file = resolve(config.night.probes_file)
    return config


def _check_exists(config: Config, path: Path) -> None:
    problems = []
    if config.model.gguf and not config.model.gguf.is_file():
        problems.append(("model.gguf", config.model.gguf, "point it at an existing .gguf file"))
    if config.model.hf_dir and not (config.model.hf_dir / "config.json").is_file():
        problems.append(
            ("model.hf_dir", config.model.hf_dir, "point it at a directory with config.json")
        )
    if config.server.kind == "llama-server":
        binary = config.server.binary
        if binary is None or not os.access(binary, os.X_OK):
            problems.append(
                ("server.binary", binary, "name the llama-server executable for kind=llama-server")
            )
    if config.night.probes_file and not config.night.probes_file.is_file():
        problems.append(("night.probes_file", config.night.probes_file,
                         "point it at a JSONL file of probes, or leave it empty"))
    if config.server.kind == "external" and not config.server.endpoint:
        problems.append(("server.endpoint", "", "set the server's URL for kind=external"))
    if problems:
        lines = [
            f"{path}: {key} = {value!s} does not exist or is unusable. Fix: {fix}."
            for key, value, fix in problems
        ]
        raise ConfigError("\n".join(lines))


def _describe(path: Path, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(part) for part in err["loc"])
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            lines.append(f"{path}: {key} is not a known key. Fix: {_known_keys(err['loc'])}.")
            continue
        fix = _field_fix(err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {key} = {value!r} is invalid: {msg}. Fix: set it to {fix}.")
    return "\n".join(lines)


def _section_model(loc: tuple) -> type[BaseModel] | None:
    model: type[BaseModel] = Config
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        if field is None or not isinstance(field.annotation, type):
            return None
        model = field.annotation
    return model


def _field_fix(loc: tuple) -> str:
    model = _section_model(loc)
    field = model.model_fields.get(str(loc[-1])) if model else None
    if field is None or not field.description:
        return "a valid value (see config.example.toml)"
    return field.description


def _known_keys(loc: tuple) -> str:
    model = _section_model(loc)
    if model is None:
        return "remove it (see config.example.toml)"
    names = ", ".join(model.model_fields)
    return f"remove or rename it; valid keys here are {names}"


# ---------------------------------------------------------------- display


def masked_dump(config: Config) -> str:
    """The resolved config as TOML-like text, with each secret shown only as set/unset."""
    lines = [f"# config: {config.source or 'embedded defaults'}"]
    for section_name in type(config).model_fields:
        section = getattr(config, section_name)
        lines.append(f"[{section_name}]")
        for key in type(section).model_fields:
            value = getattr(section, key)
            shown = _show(value)
            if key.endswith("_env"):
                state = "set" if os.environ.get(value) else "not set"
                shown += f"  # secret: {state}, value masked"
            lines.append(f"{key} = {shown}")
        lines.append("")
    return "\n".join(lines)


def _show(value: object) -> str:
    if value is None:
        return '""  # default'
    if isinstance(value, (Path, str)):
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)
