"""Server kinds: how each kind of model server is started, or only probed.

``llama-cpp-python`` runs ``python -m core.model.shim`` (``python -m
llama_cpp.server`` with its chat templates rendered without HTML escaping; see
that module), ``llama-server`` runs llama.cpp's binary with ``--jinja``, and
``external`` is started by the user: we only probe it and never signal it.
Each kind sits behind the small ``ServerKind`` protocol, and the map below is
lazy by construction: llama_cpp loads only in the child process.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Protocol

from core.config import Config
from core.model.chat_format import chat_format_name


class ServerStartError(RuntimeError):
    """The server could not be started or never became ready; the message has the log tail."""


class ServerNotReady(TimeoutError):
    """``wait_ready`` ran out of time."""


class ServerKind(Protocol):
    name: str
    spawns: bool  # False: someone else runs the server; never start or signal it

    def check(self, config: Config, gguf: Path) -> None:
        """Raise ServerStartError naming the fix if this kind cannot start."""

    def command(self, config: Config, gguf: Path, host: str, port: int,
                lora: Path | None = None) -> list[str]:
        """The argv that serves ``gguf`` (with a LoRA GGUF on top, if given) on ``host:port``."""


class LlamaCppPython:
    name = "llama-cpp-python"
    spawns = True

    def check(self, config: Config, gguf: Path) -> None:
        # find_spec, not import: llama_cpp loads a large native library we only need in the child.
        if importlib.util.find_spec("llama_cpp") is None:
            raise ServerStartError(
                "server.kind = llama-cpp-python but llama_cpp is not installed in "
                f"{sys.executable}. Fix: pip install 'llama-cpp-python[server]'."
            )
        _check_gguf(gguf)

    def command(self, config: Config, gguf: Path, host: str, port: int,
                lora: Path | None = None) -> list[str]:
        argv = [
            sys.executable, "-m", "core.model.shim",  # llama_cpp.server, templates unescaped
            "--model", str(gguf),
            "--host", host,
            "--port", str(port),
            "--chat_format", chat_format_name(config),  # resolved off the loop by Runtime.start
            "--n_ctx", str(config.model.context_tokens),
            "--model_alias", config.model.alias,
            # Its default (true) keeps every prompt token's logits: 640 MiB written per
            # 3,300-token prompt and copied on every cache save; nothing here reads them.
            "--logits_all", "false",
        ]  # fmt: skip
        if config.server.threads > 0:
            argv += ["--n_threads", str(config.server.threads)]
        if config.server.prompt_cache_mb > 0:  # core.model.prompt_cache; bench/latency.py
            argv += ["--cache", "true", "--cache_type", "ram",
                     "--cache_size", str(config.server.prompt_cache_mb * 2**20)]
        if lora is not None:
            argv += ["--lora_path", str(lora)]
        return argv + list(config.server.extra_args)


class LlamaServer:
    name = "llama-server"
    spawns = True

    def check(self, config: Config, gguf: Path) -> None:
        binary = config.server.binary
        if binary is None or not os.access(binary, os.X_OK):
            raise ServerStartError(
                f"server.binary = {binary} is not an executable. "
                "Fix: point it at llama.cpp's llama-server binary."
            )
        _check_gguf(gguf)

    def command(self, config: Config, gguf: Path, host: str, port: int,
                lora: Path | None = None) -> list[str]:
        argv = [
            str(config.server.binary),
            "-m", str(gguf),
            "--host", host,
            "--port", str(port),
            "-c", str(config.model.context_tokens),
            "--alias", config.model.alias,
            "--jinja",  # the GGUF's own chat template, which carries tool calling
        ]  # fmt: skip
        if config.server.threads > 0:
            argv += ["-t", str(config.server.threads)]
        if lora is not None:
            argv += ["--lora", str(lora)]
        return argv + list(config.server.extra_args)


class ExternalServer:
    name = "external"
    spawns = False

    def check(self, config: Config, gguf: Path) -> None:
        if not config.server.endpoint:
            raise ServerStartError(
                "server.kind = external needs server.endpoint. "
                "Fix: set it to the server's URL, e.g. http://127.0.0.1:8080/v1."
            )

    def command(self, config: Config, gguf: Path, host: str, port: int,
                lora: Path | None = None) -> list[str]:
        raise ServerStartError("an external server is started by the user, never by Nightshift")


# Lazy by construction: no kind imports its backend here; llama_cpp loads only in the child.
SERVER_KINDS: dict[str, type[ServerKind]] = {
    "llama-cpp-python": LlamaCppPython,
    "llama-server": LlamaServer,
    "external": ExternalServer,
}


def server_kind(name: str) -> ServerKind:
    try:
        return SERVER_KINDS[name]()
    except KeyError:
        known = ", ".join(SERVER_KINDS)
        raise ServerStartError(f"server.kind = {name!r} is unknown. Fix: use one of {known}.")


def _check_gguf(gguf: Path) -> None:
    if not gguf.is_file():
        raise ServerStartError(
            f"the model file {gguf} does not exist. Fix: run `make model` (the setup step "
            "that converts the embedded model) or set model.gguf to an existing .gguf file."
        )


