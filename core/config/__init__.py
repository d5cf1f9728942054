"""config.toml's schema and its loading: the root ``Config`` and ``load_config`` here, each
section's typed class in ``sections`` (the day's), ``learning`` (``[night]``, ``[train]``,
``[practice]``) and ``routines`` (sleep, notes hygiene, swarms, self-play).

config.toml is one readable file, typed per section. Every key is documented in
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

import os
import tomllib
from pathlib import Path

from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from core.config.learning import NightConfig, PracticeConfig, TrainConfig  # noqa: F401
from core.config.routines import NotesHygieneConfig, SelfplayConfig, SleepConfig, SwarmsConfig
from core.config.sections import (  # noqa: F401 - re-exported: callers import them from here
    EMBEDDED_MODEL,
    AgentConfig,
    ConfigError,
    DiscordConfig,
    DiskConfig,
    ModelConfig,
    PathsConfig,
    SandboxConfig,
    ServerConfig,
    WatchdogConfig,
    _Section,
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
    disk: DiskConfig = Field(default_factory=DiskConfig)
    sleep: SleepConfig = Field(default_factory=SleepConfig)
    notes_hygiene: NotesHygieneConfig = Field(default_factory=NotesHygieneConfig)
    swarms: SwarmsConfig = Field(default_factory=SwarmsConfig)
    practice: PracticeConfig = Field(default_factory=PracticeConfig)
    selfplay: SelfplayConfig = Field(default_factory=SelfplayConfig)

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
        """model.gguf; else the q8_0 conversion of model.hf_dir (made by ``trainer
        setup``); else the embedded model's."""
        if self.model.gguf:
            return self.model.gguf
        if self.model.hf_dir:
            return self.models_dir / f"{self.model.hf_dir.name}-q8_0.gguf"
        return self.embedded_gguf

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
