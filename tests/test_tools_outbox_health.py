"""send_file hands checked workspace files to the front end; health reports machine and services."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.paths import Workspace
from tools import Registry, ToolContext
import tools.health
import tools.outbox

REGISTRY = Registry()
REGISTRY.register_module(tools.outbox)
REGISTRY.register_module(tools.health)


@pytest.fixture
def outbox() -> list[str]:
    return []


@pytest.fixture
def ctx(tmp_path: Path, outbox: list[str]) -> ToolContext:
    return ToolContext.open("out", Workspace(tmp_path / "ws"), tmp_path / "state",
                            send_file=outbox.append)


async def call(ctx: ToolContext, name: str, /, **arguments):
    return await REGISTRY.call(name, arguments, ctx)


def put(ctx: ToolContext, path: str, data: bytes = b"hello\n") -> Path:
    target = ctx.workspace.root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


# --- send_file ---


async def test_send_file_puts_the_relative_path_in_the_outbox(ctx, outbox):
    put(ctx, "out/report.txt", b"x" * 2048)
    result = await call(ctx, "send_file", path="out/report.txt")
    assert result.ok, result.output
    assert outbox == ["out/report.txt"]
    assert "out/report.txt (2.0 KiB) will be sent" in result.output


async def test_send_file_accepts_the_sandbox_mount_path(ctx, outbox):
    put(ctx, "plot.png")
    result = await call(ctx, "send_file", path="/workspace/plot.png")
    assert result.ok, result.output
    assert outbox == ["plot.png"]


async def test_send_file_refuses_a_missing_file(ctx, outbox):
    result = await call(ctx, "send_file", path="nope.txt")
    assert not result.ok and "nope.txt does not exist" in result.output
    assert outbox == []


async def test_send_file_refuses_a_folder(ctx, outbox):
    (ctx.workspace.root / "results").mkdir()
    result = await call(ctx, "send_file", path="results")
    assert not result.ok and "is a folder" in result.output
    assert outbox == []


async def test_send_file_refuses_paths_leading_out_of_the_workspace(ctx, outbox, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    os.symlink(secret, ctx.workspace.root / "link.txt")
    for path in ["../secret.txt", str(secret), "link.txt"]:
        result = await call(ctx, "send_file", path=path)
        assert not result.ok and "workspace" in result.output, path
    assert outbox == []


async def test_send_file_refuses_files_over_8_mib(ctx, outbox):
    os.truncate(put(ctx, "big.bin", b""), 8 * 2**20 + 1)  # sparse: no 8 MiB written
    result = await call(ctx, "send_file", path="big.bin")
    assert not result.ok and "8.0 MiB" in result.output and "Compress" in result.output
    assert outbox == []


async def test_send_file_says_when_the_front_end_cannot_send_files(tmp_path):
    ctx = ToolContext.open("out", Workspace(tmp_path / "ws"), tmp_path / "state")
    put(ctx, "a.txt")
    result = await call(ctx, "send_file", path="a.txt")
    assert not result.ok and "cannot send files" in result.output


# --- health ---


async def test_health_reports_memory_disk_embedder_jobs_and_server(tmp_path):
    jobs = [{"id": 7, "kind": "python", "state": "running"}]
    ctx = ToolContext.open("h", Workspace(tmp_path / "ws"), tmp_path / "state",
                           embedder=object(), status=lambda: {"ready": True, "pid": 4242},
                           jobs=lambda: jobs)
    result = await call(ctx, "health")
    assert result.ok, result.output
    text = result.output
    for word in ("memory:", "GiB available", "this bot uses", "disk:", "free", "embedder: loaded",
                 "jobs: 1", "state=running", "server:", "ready=True", "pid=4242"):
        assert word in text, f"{word!r} not in {text!r}"
    assert len(text.splitlines()) <= 8


async def test_health_says_what_is_missing_when_no_services_are_injected(ctx):
    result = await call(ctx, "health")
    assert result.ok, result.output
    assert "embedder: not loaded" in result.output
    assert "jobs: no job runner" in result.output
    assert "server: no status available" in result.output


async def test_health_reports_failing_services_instead_of_failing(tmp_path):
    def broken():
        raise ConnectionError("server gone")

    ctx = ToolContext.open("h", Workspace(tmp_path / "ws"), tmp_path / "state",
                           status=broken, jobs=list)
    result = await call(ctx, "health")
    assert result.ok, result.output
    assert "server: the status check failed (ConnectionError: server gone)" in result.output
    assert "jobs: no background jobs" in result.output
