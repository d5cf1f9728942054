"""Shared fixtures: the GGUF the real-server tests serve, free TCP ports, and a tiny random
Llama for training tests."""

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


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny tensors: on a busy CI machine extra threads only contend."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> Path:
    """A tiny random Llama (hidden 64, 2 layers) with the real SmolLM2 tokenizer, saved."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    hf_dir = Path(__file__).parents[1] / "data/models/smollm2-135m-instruct-hf"
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tokenizer),
                         tie_word_embeddings=True)  # no pad_token_id: it would zero <|im_end|>
    path = tmp_path_factory.mktemp("tiny-base")
    LlamaForCausalLM(config).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path
