"""The workspace jail: paths stay inside the workspace, whatever links lie in the way."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sandbox.paths import MOUNT_POINT, PathEscape, Workspace, workspace_for

ALLOWED = "paths must stay inside the workspace; use relative paths like notes/a.txt"


@pytest.fixture
def ws(tmp_path) -> Workspace:
    return Workspace(tmp_path / "ws")


@pytest.fixture
def outside(tmp_path) -> Path:
    """A host folder next to the workspace, holding a secret."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("host secret")
    return folder


def refused(ws: Workspace, path: str) -> PathEscape:
    with pytest.raises(PathEscape) as caught:
        ws.resolve(path)
    return caught.value


# --- positive controls ---


def test_a_new_workspace_has_its_root_and_scratch(tmp_path):
    ws = Workspace(tmp_path / "deep" / "ws")
    assert ws.root.is_dir() and ws.scratch.is_dir()
    assert ws.scratch == ws.root / "scratch"
    assert oct(ws.root.stat().st_mode & 0o777) == oct(0o700)


def test_relative_paths_resolve_inside_the_root_even_when_missing(ws):
    assert ws.resolve("notes/a.txt") == ws.root / "notes" / "a.txt"
    assert ws.resolve(".") == ws.root
    assert ws.resolve("./notes//b.txt") == ws.root / "notes" / "b.txt"


def test_absolute_paths_inside_the_root_or_under_the_sandbox_mount_are_accepted(ws):
    assert ws.resolve(str(ws.root / "a.txt")) == ws.root / "a.txt"
    assert ws.resolve(f"{MOUNT_POINT}/out/plot.png") == ws.root / "out" / "plot.png"
    assert ws.resolve(str(MOUNT_POINT)) == ws.root


def test_symlinks_that_stay_inside_are_followed(ws):
    (ws.root / "real").mkdir()
    (ws.root / "real" / "f.txt").write_text("x")
    os.symlink("real", ws.root / "alias")
    os.symlink(ws.root / "real" / "f.txt", ws.root / "abs_alias")
    assert ws.resolve("alias/f.txt") == ws.root / "real" / "f.txt"
    assert ws.resolve("abs_alias") == ws.root / "real" / "f.txt"


def test_must_exist_names_the_missing_path_relative_to_the_workspace(ws):
    (ws.root / "here.txt").write_text("x")
    assert ws.resolve("here.txt", must_exist=True) == ws.root / "here.txt"
    with pytest.raises(FileNotFoundError) as missing:
        ws.resolve("notes/gone.txt", must_exist=True)
    assert "notes/gone.txt" in str(missing.value)
    assert str(ws.root) not in str(missing.value)


def test_relative_shows_host_paths_as_the_agent_knows_them(ws, tmp_path):
    assert ws.relative(ws.root / "notes" / "a.txt") == "notes/a.txt"
    assert ws.relative(ws.root) == "."
    with pytest.raises(PathEscape):
        ws.relative(tmp_path / "elsewhere.txt")


# --- escapes ---


@pytest.mark.parametrize("path", ["/etc/passwd", "/", "/workspacex/a", "/tmp"])
def test_absolute_paths_outside_are_refused(ws, path):
    error = refused(ws, path)
    assert "absolute path outside the workspace" in str(error)


@pytest.mark.parametrize("path", ["../x", "a/../../x", "a/../b", "..", "notes/.."])
def test_dotdot_is_refused_anywhere(ws, path):
    assert "'..' is not allowed" in str(refused(ws, path))


@pytest.mark.parametrize("path", ["", "   ", "a\0b"])
def test_empty_paths_and_nul_bytes_are_refused(ws, path):
    refused(ws, path)


def test_the_refusal_says_what_was_refused_and_what_is_allowed(ws):
    error = refused(ws, "../secret")
    assert isinstance(error, ValueError)
    assert "'../secret'" in str(error)
    assert ALLOWED in str(error)


def test_a_planted_symlink_to_etc_is_refused_and_named(ws):
    os.symlink("/etc", ws.root / "etc_link")
    for path in ("etc_link", "etc_link/passwd", "etc_link/nonexistent"):
        error = refused(ws, path)
        assert "etc_link is a symlink to /etc, outside the workspace" in str(error)


def test_a_symlink_as_the_last_component_leading_out_is_refused(ws, outside):
    os.symlink(outside / "secret.txt", ws.root / "secret.txt")
    refused(ws, "secret.txt")


def test_a_symlink_chain_that_ends_outside_is_refused(ws, outside):
    os.symlink("hop2", ws.root / "hop1")
    os.symlink("sub/hop3", ws.root / "hop2")
    (ws.root / "sub").mkdir()
    os.symlink(outside / "secret.txt", ws.root / "sub" / "hop3")
    error = refused(ws, "hop1")
    assert "hop1 is a symlink to hop2" in str(error)


def test_a_dangling_symlink_pointing_out_is_refused(ws, tmp_path):
    os.symlink(tmp_path / "not-yet" / "file.txt", ws.root / "dangling")
    refused(ws, "dangling")
    refused(ws, "dangling/below")
    assert not (tmp_path / "not-yet").exists()


def test_a_symlinked_directory_in_the_middle_is_refused(ws, outside):
    (ws.root / "a").mkdir()
    os.symlink(outside, ws.root / "a" / "mid")
    error = refused(ws, "a/mid/secret.txt")
    assert "a/mid is a symlink" in str(error)


def test_a_relative_symlink_climbing_out_is_refused(ws, outside):
    os.symlink("../outside/secret.txt", ws.root / "climb")
    refused(ws, "climb")


def test_a_symlink_loop_does_not_hang_or_escape(ws):
    os.symlink("loop_b", ws.root / "loop_a")
    os.symlink("loop_a", ws.root / "loop_b")
    try:
        resolved = ws.resolve("loop_a")
    except PathEscape:
        return
    assert ws.root in resolved.parents


# --- opening without following links (the TOCTOU gap) ---


def test_open_reads_a_file_and_writes_a_new_one(ws):
    (ws.root / "notes").mkdir()
    (ws.root / "notes" / "a.txt").write_text("hello")
    with os.fdopen(ws.open("notes/a.txt")) as f:
        assert f.read() == "hello"
    with os.fdopen(ws.open("notes/b.txt", os.O_WRONLY | os.O_CREAT), "w") as f:
        f.write("new")
    assert (ws.root / "notes" / "b.txt").read_text() == "new"


def test_open_refuses_links_leading_out_like_resolve(ws, outside):
    os.symlink(outside, ws.root / "out")
    with pytest.raises(PathEscape):
        ws.open("out/secret.txt")


def test_open_refuses_a_directory_swapped_for_a_link_after_the_check(ws, outside, monkeypatch):
    # A job running in the workspace swaps notes/ for a link between the check and the open.
    (ws.root / "notes").mkdir()
    (ws.root / "notes" / "secret.txt").write_text("mine")
    checked = Workspace.resolve

    def check_then_swap(self, path, **kw):
        result = checked(self, path, **kw)
        (ws.root / "notes" / "secret.txt").unlink()
        (ws.root / "notes").rmdir()
        os.symlink(outside, ws.root / "notes")
        return result

    monkeypatch.setattr(Workspace, "resolve", check_then_swap)
    with pytest.raises(PathEscape) as error:
        ws.open("notes/secret.txt")
    assert "changed into a link" in str(error.value)


def test_open_refuses_a_fifo_instead_of_blocking(ws):
    os.mkfifo(ws.root / "pipe")
    outcome = []

    def attempt():
        try:
            os.close(ws.open("pipe"))
            outcome.append("opened")
        except OSError:
            outcome.append("refused")

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(5)
    assert outcome == ["refused"], "opening a FIFO blocked or succeeded"


# --- scratch ---


def test_clear_scratch_empties_it_without_following_links(ws, outside):
    (ws.scratch / "f.txt").write_text("x")
    (ws.scratch / "d" / "e").mkdir(parents=True)
    (ws.scratch / "d" / "e" / "g.txt").write_text("y")
    os.symlink(outside, ws.scratch / "link_out")
    (ws.root / "keep.txt").write_text("kept")
    ws.clear_scratch()
    assert list(ws.scratch.iterdir()) == []
    assert (outside / "secret.txt").read_text() == "host secret"
    assert (ws.root / "keep.txt").read_text() == "kept"


def test_clear_scratch_never_follows_a_folder_swapped_for_a_link_mid_removal(ws, outside,
                                                                             monkeypatch):
    """The attack of issue 40: a job swaps a folder of scratch/ for a link to a host folder
    between the bot's look and its removal. Removal by descriptor unlinks the link."""
    (outside / "data" / "nights").mkdir(parents=True)
    (ws.scratch / "d" / "e").mkdir(parents=True)
    real_open, swapped = os.open, []

    def racing_open(path, flags, mode=0o777, *, dir_fd=None):
        if path == "d" and dir_fd is not None and not swapped:  # the job wins the race here
            swapped.append(True)
            os.rename(ws.scratch / "d", ws.root / "moved")
            os.symlink(outside / "data", ws.scratch / "d")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", racing_open)
    ws.clear_scratch()
    monkeypatch.undo()
    assert swapped and list(ws.scratch.iterdir()) == []
    assert (outside / "data" / "nights").is_dir() and (outside / "secret.txt").is_file()


def test_clear_scratch_removes_read_only_and_deep_folders_by_descriptor(ws):
    deep = ws.scratch.joinpath(*["n"] * 40)
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    locked = ws.scratch / "locked"
    (locked / "inner").mkdir(parents=True)
    (locked / "inner" / "f").write_text("x")
    os.chmod(locked / "inner", 0o500)
    os.chmod(locked, 0o500)
    ws.clear_scratch()
    assert list(ws.scratch.iterdir()) == []


def test_clear_scratch_replaces_a_scratch_that_became_a_link(ws, outside):
    ws.scratch.rmdir()
    os.symlink(outside, ws.scratch)
    ws.clear_scratch()
    assert ws.scratch.is_dir() and not ws.scratch.is_symlink()
    assert (outside / "secret.txt").read_text() == "host secret"


def test_a_workspace_reopened_over_a_scratch_link_repairs_it(tmp_path, outside):
    ws = Workspace(tmp_path / "ws")
    ws.scratch.rmdir()
    os.symlink(outside, ws.scratch)
    again = Workspace(tmp_path / "ws")
    assert again.scratch.is_dir() and not again.scratch.is_symlink()
    assert (outside / "secret.txt").exists()


# --- one directory per channel ---


def test_workspace_for_gives_distinct_safe_directories(tmp_path):
    channels = ["general", "General", "a/b", "a-b", "a b", "..", "/", "", "x" * 300,
                "x" * 300 + "y", "dm:1234567890", "💬 chat"]
    roots = [workspace_for(tmp_path, c).root for c in channels]
    assert len(set(roots)) == len(channels)
    for root in roots:
        assert root.parent == tmp_path.resolve()
        assert len(root.name) <= 60
        assert all(ch.isalnum() or ch in "-_" for ch in root.name)


def test_workspace_for_is_stable_and_keeps_the_name_readable(tmp_path):
    first = workspace_for(tmp_path, "general")
    assert workspace_for(tmp_path, "general").root == first.root
    assert first.root.name.startswith("general-")
