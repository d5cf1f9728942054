"""What several benchmarks need: the served model file and a free port."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

DEFAULT_GGUF = Path(__file__).parents[1] / "data/models/smollm2-135m-instruct-q8_0.gguf"


def find_gguf(arg: str | None) -> Path:
    path = Path(arg or os.environ.get("NIGHTSHIFT_TEST_GGUF") or DEFAULT_GGUF)
    if not path.is_file():
        sys.exit(f"no GGUF at {path}: run the setup step (make test) or pass --gguf PATH")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
