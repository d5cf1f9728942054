"""The undo/redo journal: it undoes only what it did, refuses when the state diverged, survives restarts."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.paths import Workspace
from tools import ToolContext, default_registry
from tools.history import Journal, JournalConflict, SnapshotTooLarge
from tools.system import read_sys_section

REGISTRY = default_registry()


def make_ctx(base: Path) -> ToolContext:
    return ToolContext.open("test", Workspace(base / "ws"), base / "state")


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return make_ctx(tmp_path)


async def ok(ctx: ToolContext, name: str, /, **arguments) -> str:
    result = await REGISTRY.call(name, arguments, ctx)
    assert result.ok, result.output
    return result.output


def snapshot(ctx: ToolContext) -> dict[str, bytes | str]:
    """Every path of the workspace, byte for byte, plus the system-prompt section."""
    root = ctx.workspace.root
    state: dict[str, bytes | str] = {"@sys": read_sys_section(ctx.state_dir)}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            state[os.path.relpath(os.path.join(folder, name), root)] = "DIR"
        for name in files:
            state[os.path.relpath(os.path.join(folder, name), root)] = Path(folder, name).read_bytes()
    return state


# --- the property: undo-all restores the start, redo-all the end ---

PATHS = ["a.txt", "b.txt", "d", "d/c.txt", "d/e", "d/e/f.txt", "g"]
TEXT = st.text(alphabet="ab\n", max_size=12)
LINE = st.integers(min_value=0, max_value=5)
OPS = st.one_of(
    st.builds(lambda p, t: ("write_file", {"path": p, "content": t}), st.sampled_from(PATHS), TEXT),
    st.builds(lambda p, s, e, t: ("edit_file", {"path": p, "mode": "replace_lines", "start": s,
                                                "end": e, "text": t}),
              st.sampled_from(PATHS), LINE, LINE, TEXT),
    st.builds(lambda p, a, t: ("edit_file", {"path": p, "mode": "insert", "after": a, "text": t}),
              st.sampled_from(PATHS), LINE, TEXT),
    st.builds(lambda p, s, e: ("edit_file", {"path": p, "mode": "delete_lines", "start": s, "end": e}),
              st.sampled_from(PATHS), LINE, LINE),
    st.builds(lambda p, o, n: ("edit_file", {"path": p, "mode": "replace_text", "old": o, "new": n}),
              st.sampled_from(PATHS), TEXT, TEXT),
    st.builds(lambda p: ("make_dir", {"path": p}), st.sampled_from(PATHS)),
    st.builds(lambda p: ("delete", {"path": p}), st.sampled_from(PATHS)),
    st.builds(lambda t: ("update_sys", {"action": "append", "text": t}), TEXT),
    st.builds(lambda t: ("update_sys", {"action": "replace", "text": t}), TEXT),
    st.builds(lambda n: ("update_sys", {"action": "delete", "line": n}), LINE),
)


async def _run_ops(ctx: ToolContext, ops: list[tuple[str, dict]]) -> None:
    for name, arguments in ops:
        await REGISTRY.call(name, arguments, ctx)  # many fail (bad lines, missing files): fine


async def _undo_all(ctx: ToolContext, name: str) -> int:
    count = 0
    while (await REGISTRY.call(name, {}, ctx)).ok:
        count += 1
    return count


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=25))
def test_undo_all_restores_every_byte_and_redo_all_restores_the_end(ops):
    with tempfile.TemporaryDirectory() as base:
        ctx = make_ctx(Path(base))
        start = snapshot(ctx)
        asyncio.run(_run_ops(ctx, ops))
        end = snapshot(ctx)
        undone = asyncio.run(_undo_all(ctx, "undo"))
        assert snapshot(ctx) == start
        assert asyncio.run(_undo_all(ctx, "redo")) == undone
        assert snapshot(ctx) == end


# --- refusals ---


async def test_undo_refuses_naming_the_file_changed_outside_the_journal(ctx):
    await ok(ctx, "write_file", path="notes.txt", content="mine\n")
    (ctx.workspace.root / "notes.txt").write_text("a python job wrote this\n")
    result = await REGISTRY.call("undo", {}, ctx)
    assert not result.ok and "notes.txt changed outside the journal" in result.output
    assert (ctx.workspace.root / "notes.txt").read_text() == "a python job wrote this\n"


async def test_redo_refuses_when_the_path_changed_since_the_undo(ctx):
    await ok(ctx, "write_file", path="notes.txt", content="mine\n")
    await ok(ctx, "undo")
    (ctx.workspace.root / "notes.txt").write_text("someone else\n")
    result = await REGISTRY.call("redo", {}, ctx)
    assert not result.ok and "notes.txt changed outside the journal" in result.output


async def test_undo_of_make_dir_refuses_when_the_folder_got_unrecorded_files(ctx):
    await ok(ctx, "make_dir", path="out")
    (ctx.workspace.root / "out/result.csv").write_text("1,2\n")
    result = await REGISTRY.call("undo", {}, ctx)
    assert not result.ok and "out/result.csv" in result.output
    assert (ctx.workspace.root / "out/result.csv").exists()


async def test_undo_with_nothing_done_says_so(ctx):
    result = await REGISTRY.call("undo", {}, ctx)
    assert not result.ok and "nothing to undo" in result.output


# --- behaviour ---


async def test_deleting_a_folder_is_undoable_with_every_file(ctx):
    for name, text in [("d/a.txt", "a"), ("d/sub/b.bin", "\x00b"), ("d/sub/deeper/c", "c")]:
        path = ctx.workspace.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    before = snapshot(ctx)
    await ok(ctx, "delete", path="d")
    assert not (ctx.workspace.root / "d").exists()
    assert "recreated d/" in await ok(ctx, "undo")
    assert snapshot(ctx) == before


async def test_a_new_change_after_undo_drops_the_redo_stack(ctx):
    await ok(ctx, "write_file", path="a.txt", content="1")
    await ok(ctx, "write_file", path="a.txt", content="2")
    await ok(ctx, "undo")
    await ok(ctx, "write_file", path="b.txt", content="new")
    result = await REGISTRY.call("redo", {}, ctx)
    assert not result.ok and "nothing to redo" in result.output
    assert (ctx.workspace.root / "a.txt").read_text() == "1"


async def test_the_journal_survives_being_recreated_from_disk(ctx, tmp_path):
    await ok(ctx, "write_file", path="a.txt", content="first")
    await ok(ctx, "write_file", path="a.txt", content="second")
    await ok(ctx, "undo")
    reopened = make_ctx(tmp_path)  # as after a restart
    assert reopened.journal is not ctx.journal
    await ok(reopened, "redo")
    assert (ctx.workspace.root / "a.txt").read_text() == "second"
    await ok(reopened, "undo")
    await ok(reopened, "undo")
    assert not (ctx.workspace.root / "a.txt").exists()
    assert "#1 " in await ok(reopened, "history")


async def test_an_interrupted_undo_completes_on_the_next_try(ctx):
    await ok(ctx, "write_file", path="a.txt", content="v1")
    await ok(ctx, "write_file", path="a.txt", content="v2")
    (ctx.workspace.root / "a.txt").write_text("v1")  # as if undo wrote the file, then crashed
    assert "undid #2" in await ok(ctx, "undo")
    assert "undid #1" in await ok(ctx, "undo")


async def test_history_is_trimmed_and_unused_blobs_are_collected(tmp_path):
    ws = Workspace(tmp_path / "ws")
    journal = Journal(tmp_path / "state", ws.root, keep=3)
    ctx = ToolContext(channel="t", workspace=ws, journal=journal, state_dir=tmp_path / "state")
    for i in range(60):
        await ok(ctx, "write_file", path="a.txt", content=f"version {i}")
    done, _ = journal.log(limit=100)
    assert len(done) <= 3 + 50
    blobs = list((tmp_path / "state/journal/blobs").glob("*/*"))
    assert len(blobs) <= len(done) + 1


async def test_the_saved_contents_never_outgrow_the_history_budget(tmp_path):
    """Only the entry count bounded the journal: 137 GiB a channel was possible (issue 40).
    Past ``history_bytes`` the oldest entries go; the newest is always undoable."""
    from sandbox.shared_limits import usage_bytes

    ws = Workspace(tmp_path / "ws")
    journal = Journal(tmp_path / "state", ws.root, history_bytes=256 * 1024)
    ctx = ToolContext(channel="t", workspace=ws, journal=journal, state_dir=tmp_path / "state")
    for i in range(40):  # 40 distinct 32 KiB versions: 1.25 MiB of history unbounded
        await ok(ctx, "write_file", path="a.txt", content=f"{i:04d}" * 8192)
        assert usage_bytes(tmp_path / "state/journal/blobs") <= 256 * 1024 + 40 * 1024
    done, _ = journal.log(limit=100)
    assert 1 <= len(done) < 40
    await ok(ctx, "undo")
    assert (ws.root / "a.txt").read_text() == "0038" * 8192


async def test_a_change_too_large_to_snapshot_is_refused_before_anything_changes(tmp_path):
    ws = Workspace(tmp_path / "ws")
    journal = Journal(tmp_path / "state", ws.root, max_snapshot_bytes=100)
    ctx = ToolContext(channel="t", workspace=ws, journal=journal, state_dir=tmp_path / "state")
    (ws.root / "big.txt").write_text("x" * 1000)
    result = await REGISTRY.call("delete", {"path": "big.txt"}, ctx)
    assert not result.ok and "too much to undo" in result.output
    assert (ws.root / "big.txt").exists()
    with pytest.raises(SnapshotTooLarge):
        with journal.change("direct") as tx:
            tx.touch(ws.root / "big.txt")


def test_the_state_dir_must_lie_outside_the_workspace(tmp_path):
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(ValueError, match="outside the workspace"):
        Journal(ws.root / "state", ws.root)


def test_journal_conflict_is_a_value_error_the_registry_turns_into_an_observation():
    assert issubclass(JournalConflict, ValueError)
