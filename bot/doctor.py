"""``python -m bot doctor``: the resolved config, then one pass/fail line per part.

Each check is a small function returning (ok, detail); a check that raises is
a failure whose detail is the exception, so one broken part never hides the rest.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from pathlib import Path
from typing import Awaitable, Callable

from bot.model_pair import check_pair
from core.config import Config, masked_dump
from core.model.chat_format import resolve_async
from sandbox.paths import Workspace
from sandbox.process import Sandbox, SandboxUnavailable, find_bwrap
from serving.client import LLM
from serving.supervisor import ServerSupervisor
from tools import ToolError, worker

MIN_FREE_GB = 5.0
Check = Callable[[Config], Awaitable[tuple[bool, str]]]


async def check_model_files(config: Config) -> tuple[bool, str]:
    gguf, hf = config.served_gguf, config.base_hf_dir
    problems = []
    if not gguf.is_file():
        problems.append(f"{gguf} missing (run `make model` or `python -m trainer setup`)")
    elif gguf.open("rb").read(4) != b"GGUF":
        problems.append(f"{gguf} is not a GGUF file")
    if not (hf / "config.json").is_file() or not list(hf.glob("*.safetensors")):
        problems.append(f"{hf} has no HF checkpoint (run `python -m trainer setup`)")
    if problems:
        return False, "; ".join(problems)
    size = gguf.stat().st_size / 2**20
    return True, f"{gguf.name} ({size:.0f} MiB), HF checkpoint {hf.name}"


async def check_model_pair(config: Config) -> tuple[bool, str]:
    """The GGUF served and the HF checkpoint trained must be one model (bot.model_pair)."""
    gguf, hf = config.served_gguf, config.base_hf_dir
    if not gguf.is_file() or not (hf / "config.json").is_file():
        return False, "needs both model files (see the line above)"
    return await asyncio.to_thread(check_pair, gguf, hf)


async def check_chat_format(config: Config) -> tuple[bool, str]:
    """What model.chat_format resolves to, and why (core.model.chat_format)."""
    choice = await resolve_async(config)
    return True, f"{choice.name}: {choice.reason}"


async def check_server(config: Config) -> tuple[bool, str]:
    # A free port, so the check never collides with a bot that is already running.
    port = None if config.server.kind == "external" else _free_port(config.server.host)
    supervisor = ServerSupervisor(config, port=port)
    started = time.monotonic()
    try:
        await supervisor.start(watchdog=False)
        ready_s = time.monotonic() - started
        async with LLM(config, supervisor) as llm:
            reply = await llm.chat([{"role": "user", "content": "Say OK."}], max_tokens=4)
        return True, f"ready in {ready_s:.1f} s, canary answered {reply.content.strip()!r}"
    finally:
        await supervisor.stop()


async def check_bubblewrap(config: Config) -> tuple[bool, str]:
    """Runs a real sandboxed program the way the tools do (unprivileged uid, no network)."""
    import tempfile


    sandbox = Sandbox(allow_unsandboxed=config.sandbox.allow_unsandboxed)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            result = await sandbox.run(["python3", "-c", "import os; print(os.getuid())"],
                                       Workspace(Path(tmp) / "ws"), timeout_s=30)
        except SandboxUnavailable as exc:
            return False, str(exc)
    if not result.ok:
        return False, f"a sandboxed python3 failed: {result.stderr.strip()[:300]}"
    if not result.sandboxed:
        return True, "bwrap missing; sandbox.allow_unsandboxed = true (UNSAFE: no sandbox)"
    return True, f"{find_bwrap()} runs code as uid {result.stdout.strip()}, no network"


async def check_parse_worker(config: Config) -> tuple[bool, str]:
    """Runs the parse worker's probe in the jail of read_pdf and view_image (tools.worker):
    sealed, as an unprivileged uid, and able to read the pypdf and Pillow it is given."""
    box = Sandbox(allow_unsandboxed=config.sandbox.allow_unsandboxed)
    wanted = [f"{worker.SEALED_DIR}/{name}/__init__.py" for name in worker.PACKAGES]
    try:
        seen = await asyncio.to_thread(worker.run, "probe_packages", {"read": wanted},
                                       what="the parse worker", box=box)
    except ToolError as exc:
        return False, str(exc)
    if box.bwrap is None:
        return True, "bwrap missing; sandbox.allow_unsandboxed = true (UNSAFE: parsed unsealed)"
    if seen["uid"] == 0:
        return False, "the sealed worker runs as root"
    missing = [path for path, got in seen["read"].items()
               if got.startswith(("FileNotFoundError", "PermissionError"))]
    if missing:  # e.g. packages installed under umask 077: the sandbox user cannot read them
        return False, f"the sealed worker cannot read {', '.join(missing)}; make them world-readable"
    return True, (f"sealed as uid {seen['uid']}, alone in its PID namespace (pids "
                  f"{seen['pids']}), pypdf and Pillow readable")


async def check_embedder(config: Config) -> tuple[bool, str]:
    def run() -> tuple[bool, str]:
        import chromadb

        from core.storage.embedder import MiniLMEmbedder

        client = chromadb.EphemeralClient()
        notes = client.get_or_create_collection("doctor-check", embedding_function=MiniLMEmbedder())
        notes.add(ids=["a", "b"], documents=["cats are small pets", "the stock market fell"])
        hit = notes.query(query_texts=["a kitten"], n_results=1)["ids"][0][0]
        return hit == "a", f"chromadb {chromadb.__version__}, all-MiniLM-L6-v2 offline (nearest ok: {hit == 'a'})"

    return await asyncio.to_thread(run)


async def check_disk(config: Config) -> tuple[bool, str]:
    where = config.data_dir if config.data_dir.exists() else Path(config.data_dir.anchor)
    free = shutil.disk_usage(where).free / 2**30
    return free >= MIN_FREE_GB, f"{free:.1f} GiB free at {where} (need {MIN_FREE_GB:.0f})"


CHECKS: list[tuple[str, Check]] = [
    ("model files", check_model_files),
    ("model pair", check_model_pair),
    ("chat format", check_chat_format),
    ("server start and canary", check_server),
    ("bubblewrap", check_bubblewrap),
    ("parse worker", check_parse_worker),
    ("chromadb and embedder", check_embedder),
    ("disk space", check_disk),
]


async def run_doctor(config: Config) -> int:
    print(masked_dump(config))
    failures = 0
    for name, check in CHECKS:
        try:
            ok, detail = await check(config)
        except Exception as exc:  # a broken part is reported, never hides the others
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    print(f"{len(CHECKS) - failures} passed, {failures} failed")
    return 1 if failures else 0


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
