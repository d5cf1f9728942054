"""Channel workspaces on disk (bot.disk.workspaces): their number is bounded, a person's
channels share one bound, judged practice attempts are reclaimed past the kept ones, and
nothing else is ever removed; reclaiming never follows a link out."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bot.channels import ChannelSpaces
from bot.disk.workspaces import SpaceRefused, Workspaces, default_owner
from sandbox.disk_budget import DiskBudget
from tools import Services

MIB = 2**20


def spaces(data: Path, budget: DiskBudget | None = None, **bounds) -> ChannelSpaces:
    workspaces = Workspaces(data, budget, **bounds)
    return ChannelSpaces(data, services=Services(disk=budget), workspaces=workspaces)


def folders(data: Path, parent: str = "workspaces") -> set[str]:
    return set(os.listdir(data / parent)) if (data / parent).is_dir() else set()


def test_a_new_workspace_past_the_count_is_refused_and_the_old_ones_work_on(tmp_path):
    data = tmp_path / "data"
    s = spaces(data, max_count=3)
    for name in ("one", "two", "dm-7"):
        s.context(name).workspace.resolve("a.txt").write_text(name)
    with pytest.raises(SpaceRefused, match=r"the bot keeps 3 workspaces.*disk.max_workspaces"):
        s.context("four")
    assert len(folders(data)) == 3
    assert s.context("one").workspace.resolve("a.txt").read_text() == "one"
    again = spaces(data, max_count=3)  # after a restart, the records and folders count
    assert again.context("two").workspace.resolve("a.txt").read_text() == "two"
    with pytest.raises(SpaceRefused):
        again.context("five")


def test_a_persons_new_thread_is_refused_once_their_channels_fill_their_share(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    budget = DiskBudget(data, 100 * MIB, user_percent=3)  # 3 MiB a person
    budget.refresh()
    s = spaces(data, budget)
    dm = s.context("dm-42")  # a DM's key says whose it is
    assert default_owner("dm-42") == "user-42"
    dm.workspace.resolve("big.bin").write_bytes(os.urandom(3 * MIB))
    budget.refresh()
    with pytest.raises(SpaceRefused, match="your channels .* have used your share"):
        s.context("thread-1", owner="user-42")
    s.context("thread-2", owner="user-43")  # another person is not held by it
    assert "thread-1" not in json.loads((data / "workspaces.json").read_text())["channels"]


def test_a_full_data_folder_refuses_new_workspaces_and_keeps_what_it_holds(tmp_path):
    data = tmp_path / "data"
    s = spaces(data)
    s.context("old").workspace.resolve("keep.txt").write_text("kept")
    budget = DiskBudget(data, 64 * 1024)
    budget.refresh()
    s = spaces(data, budget)
    (data / "filler").write_bytes(os.urandom(64 * 1024))
    budget.refresh()
    with pytest.raises(SpaceRefused, match="the bot's disk is full"):
        s.context("new")
    assert s.context("old").workspace.resolve("keep.txt").read_text() == "kept"


def practice(s: ChannelSpaces, n: int) -> str:
    channel = f"practice-set-task-1-{n}"
    ctx = s.context(channel)
    ctx.workspace.resolve("answer.txt").write_bytes(os.urandom(64 * 1024))
    (ctx.state_dir / "note").write_text("state")
    return channel


async def test_judged_attempts_past_the_kept_ones_are_reclaimed_oldest_first(tmp_path):
    data = tmp_path / "data"
    budget = DiskBudget(data, 100 * MIB)
    s = spaces(data, budget, keep_throwaway=2)
    s.context("general").workspace.resolve("mine.txt").write_text("a person's file")
    attempts = [practice(s, n) for n in range(5)]
    open_attempt = practice(s, 5)  # still running: never reclaimed
    for channel in attempts:
        await s.retire(channel)
    before = budget.refresh()
    assert s.workspaces.reclaim() == 3
    left = folders(data)
    assert len(left) == 1 + 2 + 1  # general, the two newest judged attempts, the open one
    assert any(name.startswith("general-") for name in left)
    assert all(not name.startswith(f"practice-set-task-1-{n}-") for n in range(3)
               for name in left | folders(data, "channels"))
    assert s.context(open_attempt).workspace.resolve("answer.txt").is_file()
    assert budget.total() < before
    assert s.workspaces.reclaim() == 0  # nothing more past the kept ones
    records = json.loads((data / "workspaces.json").read_text())["channels"]
    assert set(records) == {"general", *attempts[3:], open_attempt}


async def test_retiring_drops_the_context_and_a_reused_attempt_starts_fresh(tmp_path):
    data = tmp_path / "data"
    s = spaces(data, keep_throwaway=0)
    channel = practice(s, 0)
    first = s.context(channel)
    await s.retire(channel)
    assert s.workspaces.reclaim() == 1
    again = s.context(channel)
    assert again is not first and not again.workspace.resolve("answer.txt").exists()


def test_folders_from_before_the_records_count_and_only_attempts_are_reclaimed(tmp_path):
    data = tmp_path / "data"
    for name in ("practice-old-run-0-abc", "selfplay-3-r1-s0-def", "123456-0123456789abcdef"):
        (data / "workspaces" / name).mkdir(parents=True)
        (data / "workspaces" / name / "f").write_text("x")
    (data / "channels" / "practice-old-run-0-abc").mkdir(parents=True)
    (data / "workspaces.json").write_text("{not json")  # unreadable: never fatal
    w = Workspaces(data, max_count=10, keep_throwaway=0)
    assert len(w) == 3
    assert w.reclaim() == 2
    assert folders(data) == {"123456-0123456789abcdef"}
    assert folders(data, "channels") == set()


async def test_reclaiming_never_follows_a_link_out_of_the_data_folder(tmp_path):
    """A job can leave links in its workspace, or swap the workspace itself for one:
    they are removed as links, and what they point at is untouched."""
    canary = tmp_path / "host"
    (canary / "keep").mkdir(parents=True)
    (canary / "keep" / "precious.txt").write_text("host file")
    data = tmp_path / "data"
    s = spaces(data, keep_throwaway=0)
    inside = practice(s, 0)
    os.symlink(canary, s.context(inside).workspace.root / "escape")
    swapped = practice(s, 1)
    root = s.context(swapped).workspace.root
    os.rename(root, tmp_path / "moved-away")
    os.symlink(canary, root)  # the workspace folder is now a link to the host's folder
    await s.retire(inside)
    await s.retire(swapped)
    assert s.workspaces.reclaim() == 2
    assert (canary / "keep" / "precious.txt").read_text() == "host file"
    assert not root.exists() and not root.is_symlink()
