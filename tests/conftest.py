"""Shared fixtures: the GGUF the real-server tests serve, and free TCP ports."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from core.model.shim import plain_cpu_buffers

DEFAULT_GGUF = Path(__file__).parents[1] / "data/models/smollm2-135m-instruct-q8_0.gguf"


@pytest.fixture(scope="session")
def served_gguf() -> Path:
    """The model for integration tests: $NIGHTSHIFT_TEST_GGUF, else the embedded q8_0 GGUF.

    A missing model fails the test rather than skipping it: a skipped
    integration test looks like a passing one.
    """
    env = os.environ.get("NIGHTSHIFT_TEST_GGUF")
    path = Path(env) if env else DEFAULT_GGUF
    if not path.is_file():
        source = "NIGHTSHIFT_TEST_GGUF" if env else "the embedded model's default path"
        pytest.fail(
            f"no GGUF for the real-server tests at {path} ({source}). "
            "Fix: run `make test` (which runs the setup step that converts the embedded "
            "model to q8_0 under data/models), or set NIGHTSHIFT_TEST_GGUF to a .gguf file.",
            pytrace=False,
        )
    plain_cpu_buffers()  # as the server and the gate load models (core.model.shim)
    return path


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
