"""Every kind of write answers to the data folder's budget: tool writes, program output,
undo copies, attachments and notes are refused past it with a message that says so, and
nothing already stored is lost. The channel sees its own use, never another's."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest

import tools.notes
from bot.commands import Caller, run_command
from bot.discord_front.render import save_attachments
from bot.disk.workspaces import SpaceRefused
from core.storage.embedder import MiniLMEmbedder
from sandbox.disk_budget import DiskBudget
from sandbox.paths import Workspace
from sandbox.process import Sandbox
from tests.discord_helpers import make_config, start_runtime
from tests.scripted import ScriptedLLM, say
from tools import Registry, ToolContext, default_registry
from tools.notes import NoteStore

MIB = 2**20
REGISTRY = default_registry()


def open_channel(data: Path, channel: str, budget: DiskBudget, **services) -> ToolContext:
    name = f"{channel}-0"
    ctx = ToolContext.open(channel, Workspace(data / "workspaces" / name),
                           data / "channels" / name, disk=budget, **services)
    budget.bind(channel, [ctx.workspace.root, ctx.state_dir], owner=None)
    return ctx


def full_budget(data: Path, room: int, **shares) -> DiskBudget:
    """A budget with ``room`` bytes left over what the data folder holds now."""
    budget = DiskBudget(data, None, **shares)
    budget.budget = budget.refresh() + room
    return budget


async def test_a_tool_write_past_the_budget_is_refused_and_the_old_file_stays(tmp_path):
    data = tmp_path / "data"
    budget = DiskBudget(data, None)
    ctx = open_channel(data, "room", budget)
    ok = await REGISTRY.call("write_file", {"path": "a.txt", "content": "kept"}, ctx)
    assert ok.ok, ok.output
    budget.budget = budget.refresh() + 64 * 1024
    result = await REGISTRY.call("write_file", {"path": "a.txt", "content": "x" * 200_000}, ctx)
    assert not result.ok and "the bot's disk is full" in result.output
    assert "disk.budget_mb" in result.output
    assert (ctx.workspace.root / "a.txt").read_text() == "kept"
    done, _ = ctx.journal.log()
    assert [e.label for e in done] == ["write_file a.txt"]  # the refused write left no entry
    small = await REGISTRY.call("write_file", {"path": "b.txt", "content": "y" * 1000}, ctx)
    assert small.ok, small.output  # what fits is still written
    assert budget.refresh() <= budget.budget


async def test_a_channel_past_its_share_is_refused_while_another_writes(tmp_path):
    data = tmp_path / "data"
    budget = full_budget(data, 0, channel_percent=50)
    budget.budget = 4 * MIB
    greedy = open_channel(data, "greedy", budget)
    other = open_channel(data, "other", budget)
    big = {"path": "big.txt", "content": "z" * (MIB + MIB // 2)}
    assert (await REGISTRY.call("write_file", big, greedy)).ok
    refused = await REGISTRY.call("write_file", {**big, "path": "big2.txt"}, greedy)
    assert not refused.ok and "this channel has used its share" in refused.output
    assert (await REGISTRY.call("write_file", big, other)).ok


@pytest.fixture
def sandboxed() -> None:
    if not Sandbox().sandboxed:
        pytest.fail("bubblewrap 0.8+ is missing, so sandboxed Python cannot be tested. Fix: "
                    "apt-get install bubblewrap.", pytrace=False)


PROGRAM = """
import os, time
for i in range(200):
    with open(f"out{i}.bin", "wb") as f:
        f.write(os.urandom(1 << 20))
    time.sleep(0.02)
print("wrote everything")
"""


async def test_a_program_writing_past_the_budget_is_stopped(tmp_path, sandboxed):
    data = tmp_path / "data"
    budget = full_budget(data, 0)
    ctx = open_channel(data, "prog", budget, sandbox=Sandbox(disk=budget))
    budget.budget = budget.refresh() + 8 * MIB
    result = await REGISTRY.call("run_python", {"code": PROGRAM, "timeout_s": 60}, ctx)
    assert result.ok, result.output
    assert "wrote everything" not in result.output
    assert "the bot's disk is full" in result.output
    assert "not journaled" in result.output  # no room for undo copies either
    written = len(list(ctx.workspace.root.glob("out*.bin")))
    assert 0 < written < 200  # kept, not deleted: only further writes are refused
    # Stopped where as much again as its last poll's growth would pass the budget; a late
    # poll (a loaded CPU) may still let it pass by what it wrote meanwhile: bounded here.
    assert budget.refresh() <= budget.budget + 16 * MIB
    again = await REGISTRY.call("run_python", {"code": PROGRAM, "timeout_s": 60}, ctx)
    assert "wrote everything" not in again.output and "disk is full" in again.output
    assert budget.refresh() <= budget.budget + 16 * MIB


async def test_no_program_starts_when_the_budget_has_no_room(tmp_path, sandboxed):
    data = tmp_path / "data"
    budget = full_budget(data, 0)
    ctx = open_channel(data, "full", budget, sandbox=Sandbox(disk=budget))
    budget.budget = budget.refresh()  # not a byte left
    for tool, args in (("run_python", {"code": "print('ran')"}),
                       ("job_start", {"code": "print('ran')"})):
        result = await REGISTRY.call(tool, args, ctx)
        assert not result.ok and "not started: the disk is full" in result.output, tool
    assert not (ctx.workspace.root / "jobs").exists()


async def test_undo_copies_are_skipped_with_a_note_when_the_budget_has_no_room(tmp_path, sandboxed):
    data = tmp_path / "data"
    budget = DiskBudget(data, None)
    ctx = open_channel(data, "undo", budget, sandbox=Sandbox(disk=budget))
    (ctx.workspace.root / "data.bin").write_bytes(os.urandom(2 * MIB))
    budget.budget = budget.refresh() + MIB  # room for the run, not for a 2 MiB copy
    result = await REGISTRY.call("run_python", {"code": "print('hi')"}, ctx)
    assert result.ok and "hi" in result.output
    assert "no room for undo copies" in result.output
    assert budget.refresh() <= budget.budget


class Attachment:
    def __init__(self, filename: str, data: bytes) -> None:
        self.filename, self._data, self.size = filename, data, len(data)

    async def read(self) -> bytes:
        return self._data


async def test_attachments_past_the_budget_are_not_saved(tmp_path):
    data = tmp_path / "data"
    budget = full_budget(data, 0)
    ctx = open_channel(data, "uploads", budget)
    budget.budget = budget.refresh() + 3 * MIB
    notes = []
    for n in range(5):  # five messages, each with a 1 MiB file
        notes += await save_attachments([Attachment(f"f{n}.bin", os.urandom(MIB))],
                                        ctx.workspace, disk=budget, channel="uploads")
    saved = [n for n in notes if n.startswith("[attached")]
    refused = [n for n in notes if n.startswith("[not saved")]
    assert len(saved) == 2 and len(refused) == 3, notes
    assert "the bot's disk is full" in refused[0]
    assert budget.refresh() <= budget.budget


class TinyEmbedder(MiniLMEmbedder):
    """chromadb's side is real; the vectors are cheap (what is measured is the caps)."""

    def __init__(self) -> None:
        pass

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.array([[len(t) % 7 + 1.0, 1.0, 0.5] for t in texts], dtype=np.float32)


async def test_notes_are_capped_per_channel_and_count_in_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(tools.notes, "MAX_NOTES", 3)
    registry = Registry()
    registry.register_module(tools.notes)
    data = tmp_path / "data"
    budget = full_budget(data, 0)
    notes = NoteStore(data / "notes", TinyEmbedder())
    budget.budget = budget.refresh() + 64 * MIB
    ctx = open_channel(data, "notes", budget, notes=notes)
    for n in range(3):
        made = await registry.call("note_create", {"title": f"t{n}", "text": f"fact {n}"}, ctx)
        assert made.ok, made.output
    capped = await registry.call("note_create", {"title": "t", "text": "one more"}, ctx)
    assert not capped.ok and "this channel has 3 notes, the most kept" in capped.output
    budget.budget = budget.total() + 1024  # no room for another note
    monkeypatch.setattr(tools.notes, "MAX_NOTES", 100)
    full = await registry.call("note_create", {"title": "t", "text": "one more"}, ctx)
    assert not full.ok and "disk is full" in full.output
    assert notes.count("notes") == 3  # the stored notes are all still there


async def test_health_shows_this_channels_use_and_the_total_never_another_channels(tmp_path):
    data = tmp_path / "data"
    budget = full_budget(data, 50 * MIB, channel_percent=10)
    mine = open_channel(data, "mine", budget)
    other = open_channel(data, "secret-neighbour", budget)
    await REGISTRY.call("write_file", {"path": "x.txt", "content": "x" * 100_000}, other)
    result = await REGISTRY.call("health", {}, mine)
    line = next(line for line in result.output.splitlines() if line.startswith("disk budget:"))
    assert "this channel uses" in line and "the data folder uses" in line and "budget" in line
    assert "secret-neighbour" not in result.output


async def test_the_runtime_measures_in_the_background_shows_status_and_bounds_channels(
        tmp_path):
    """Through the real runtime (SQLite store, channel workers, the disk watch task)."""
    config = make_config(tmp_path)
    config.disk.max_workspaces, config.disk.refresh_s = 2, 0.05
    rt = await start_runtime(config, ScriptedLLM(lambda messages, kwargs: say("ok")))
    try:
        await rt.turn("general", "hi")
        ctx = rt.spaces.context("general")
        (ctx.workspace.root / "f.bin").write_bytes(os.urandom(MIB))  # behind the tools' back
        disk = rt.spaces.services.disk
        for _ in range(100):  # the watch measures it, in a thread
            if disk.usage("general").channel >= MIB:
                break
            await asyncio.sleep(0.05)
        assert disk.usage("general").channel >= MIB
        await rt.turn("second-secret", "hi")
        caller = Caller(1, (), "general", "admin", local=True)
        status = (await run_command(rt, caller, "status")).text
        line = next(line for line in status.splitlines() if line.startswith("disk: "))
        assert "this channel uses 1.0 MiB" in line and "budget" in line
        assert "second-secret" not in line
        with pytest.raises(SpaceRefused, match="disk.max_workspaces"):
            await rt.turn("third", "hi")
    finally:
        await rt.close()
