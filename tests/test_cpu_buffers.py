"""On a CPU with AMX, models load with llama.cpp's extra buffer types off
(core.model.shim.plain_cpu_buffers): its AMX matrix product segfaulted here on every
prompt of more than one token."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core.model.shim import has_amx

AMX_FLAGS = "flags\t\t: fpu vme sse avx2 avx512f amx_bf16 amx_tile amx_int8\n"
NO_AMX = "flags\t\t: fpu vme sse avx2 avx512f avx512_vnni\n"


def test_amx_is_read_from_the_cpu_flags(tmp_path):
    (tmp_path / "amx").write_text("processor\t: 0\n" + AMX_FLAGS)
    (tmp_path / "plain").write_text("processor\t: 0\n" + NO_AMX)
    assert has_amx(tmp_path / "amx")
    assert not has_amx(tmp_path / "plain")
    assert not has_amx(tmp_path / "missing")  # no /proc: nothing to turn off


@pytest.mark.slow
def test_a_prompt_of_many_tokens_is_read_after_the_patch(served_gguf):
    """In a fresh process, as the server loads it: on this machine the unpatched load
    segfaulted in llama_decode on this very prompt."""
    code = ("from core.model.shim import patch_handlers; patch_handlers()\n"
            "from llama_cpp import Llama\n"
            f"llm = Llama({str(served_gguf)!r}, n_ctx=1024, verbose=False)\n"
            "out = llm.create_completion('word ' * 300, max_tokens=2, temperature=0)\n"
            "print(out['usage']['prompt_tokens'])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) >= 300
