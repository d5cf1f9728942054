"""llama.cpp's own GGUF converters, taken from the llama-cpp-python sdist.

The wheel of llama-cpp-python does not carry ``convert_hf_to_gguf.py``; the
sdist does, under ``vendor/llama.cpp/``, together with the ``gguf-py`` it must
run with (its version matches the converter, the ``gguf`` wheel on PyPI may
not). We fetch the sdist once with pip, extract only the converter scripts,
their ``conversion`` package and ``gguf-py`` into the cache directory, and run
them as subprocesses. None of llama.cpp's code is committed to this repository.

The sdist is pinned by its SHA-256 (pip checks it, ``--require-hashes``, and so do we
before extracting): code that runs on the owner's machine must be the code we read.
The converters run with a minimal environment, not the bot's: no token or key in the
environment reaches code fetched from a package registry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from serving.releases import sha256_file

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_SHA256 = {  # the PyPI sdist of each version we know
    "0.3.36": "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
}
_ENV_KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "OMP_NUM_THREADS")
_WANTED = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")


class ConverterError(RuntimeError):
    """The converter could not be fetched or failed to convert."""


def converter_dir(cache_dir: Path, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return cache_dir / f"llama.cpp-converter-{version}"


def fetch_converter(cache_dir: Path, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """Return the extracted converter directory, downloading the sdist only once."""
    target = converter_dir(cache_dir, version)
    if (target / "convert_hf_to_gguf.py").is_file() and (target / ".complete").is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        print(f"fetching llama.cpp's converter from the llama-cpp-python {version} sdist ...",
              flush=True)
        expected = SDIST_SHA256.get(version)
        if expected is None:
            raise ConverterError(f"no known SHA-256 for the llama-cpp-python {version} sdist; "
                                 f"the known versions are {', '.join(SDIST_SHA256)}")
        pinned = Path(tmp) / "requirements.txt"
        pinned.write_text(f"llama-cpp-python=={version} --hash=sha256:{expected}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
               "--require-hashes", "--quiet", "-r", str(pinned), "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        sdists = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if done.returncode != 0 or not sdists:
            raise ConverterError(
                f"could not download the llama-cpp-python {version} sdist with pip:\n"
                f"{done.stderr[-2000:]}"
            )
        if sha256_file(sdists[0]) != expected:
            raise ConverterError(f"{sdists[0].name} is not the sdist pinned for {version} "
                                 "(its SHA-256 differs); refusing to run it")
        staging = Path(tmp) / "out"
        _extract(sdists[0], staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    (target / ".complete").write_text(version)
    return target


def _extract(sdist: Path, out: Path) -> None:
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            _, _, rest = member.name.partition("/vendor/llama.cpp/")
            if not rest or not rest.startswith(_WANTED) or not (member.isfile() or member.isdir()):
                continue
            member.name = rest
            tar.extract(member, out, filter="data")
    if not (out / "convert_hf_to_gguf.py").is_file():
        raise ConverterError(f"{sdist.name} has no vendor/llama.cpp/convert_hf_to_gguf.py")


def _env(conv: Path) -> dict[str, str]:
    """The converter's environment: a few harmless variables, never the bot's secrets."""
    env = {k: os.environ[k] for k in _ENV_KEPT if k in os.environ}
    # The vendored gguf-py must shadow any installed gguf wheel.
    env["PYTHONPATH"] = os.pathsep.join([str(conv / "gguf-py"), str(conv)])
    env["NO_LOCAL_GGUF"] = ""
    env["HF_HUB_OFFLINE"] = "1"  # a converter must never reach for a model hub
    return env


def convert_hf_to_gguf(conv: Path, hf_dir: Path, out_file: Path, outtype: str = "q8_0") -> Path:
    """Convert an HF checkpoint directory into one GGUF file (atomically)."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    partial = out_file.with_name(out_file.name + ".partial")
    cmd = [sys.executable, str(conv / "convert_hf_to_gguf.py"), str(hf_dir),
           "--outfile", str(partial), "--outtype", outtype]
    _run(cmd, conv, f"converting {hf_dir} to {outtype}")
    os.replace(partial, out_file)
    return out_file


def convert_lora_to_gguf(conv: Path, adapter_dir: Path, base_dir: Path, out_file: Path,
                         outtype: str = "f16") -> Path:
    """Convert a PEFT adapter into a GGUF LoRA that llama.cpp loads with --lora."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    partial = out_file.with_name(out_file.name + ".partial")
    cmd = [sys.executable, str(conv / "convert_lora_to_gguf.py"), str(adapter_dir),
           "--base", str(base_dir), "--outfile", str(partial), "--outtype", outtype]
    _run(cmd, conv, f"converting adapter {adapter_dir}")
    os.replace(partial, out_file)
    return out_file


def _run(cmd: list[str], conv: Path, what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(conv))
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise ConverterError(f"llama.cpp converter failed while {what}:\n{tail}")
