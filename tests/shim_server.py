"""The real llama.cpp server through ``core.model.shim``, for tests that post to it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from core.model.wire import FUNCTION_CALLING


@contextmanager
def shim_server(gguf: Path, port: int, log_dir: Path, n_ctx: int = 2048) -> Iterator[str]:
    """Start it, wait until /v1/models answers (its log in the assertion if it dies),
    yield the base URL, and kill it."""
    argv = [sys.executable, "-m", "core.model.shim", "--model", str(gguf), "--port", str(port),
            "--chat_format", FUNCTION_CALLING, "--n_ctx", str(n_ctx)]
    base = f"http://127.0.0.1:{port}/v1"
    log_path = log_dir / "server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, log_path.read_text()[-2000:]
            try:
                if httpx.get(f"{base}/models", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the shimmed server never answered /v1/models"
            time.sleep(0.2)
        yield base
    finally:
        server.kill()
        server.wait(timeout=10)
