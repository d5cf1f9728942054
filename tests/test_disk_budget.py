"""The data folder's budget (sandbox.disk_budget): measured from real files, a write past
the budget or a share refused with a message that says so, nothing stored deleted."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sandbox.disk_budget import BLOCK, DiskBudget, DiskFull, automatic_budget, blocks, measure
from sandbox.shared_limits import usage_bytes

MIB = 2**20


def fill(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def layout(data: Path) -> dict[str, Path]:
    """A data folder as the bot lays it out: two channels, the store, a model."""
    paths = {"ws_a": data / "workspaces" / "a-1", "st_a": data / "channels" / "a-1",
             "ws_b": data / "workspaces" / "b-2", "st_b": data / "channels" / "b-2"}
    fill(paths["ws_a"] / "f.bin", 2 * MIB)
    fill(paths["st_a"] / "journal" / "blob", MIB)
    fill(paths["ws_b"] / "g.bin", 3 * MIB)
    paths["st_b"].mkdir(parents=True)
    fill(data / "nightshift.db", MIB)
    fill(data / "models" / "m.gguf", 4 * MIB)
    return paths


def test_refresh_measures_each_workspace_and_state_folder_on_its_own(tmp_path):
    data = tmp_path / "data"
    paths = layout(data)
    budget = DiskBudget(data, 100 * MIB)
    total = budget.refresh()
    split = sum(os.lstat(data / name).st_blocks * 512 for name in ("workspaces", "channels"))
    assert total == usage_bytes(data) - split  # every byte below, each area on its own
    budget.bind("a", [paths["ws_a"], paths["st_a"]])
    assert budget.usage("a").channel == measure(paths["ws_a"]) + measure(paths["st_a"])
    assert budget.area(paths["ws_a"] / "deep" / "file") == "workspaces/a-1"
    assert budget.area(data / "models" / "x") == "models"
    assert budget.area(tmp_path / "elsewhere") is None


def test_a_write_past_the_budget_is_refused_and_nothing_is_counted(tmp_path):
    data = tmp_path / "data"
    paths = layout(data)
    budget = DiskBudget(data, 12 * MIB)
    used = budget.refresh()
    budget.bind("a", [paths["ws_a"], paths["st_a"]])
    room = budget.room("a")
    # A hundredth of the budget is kept back for what writes take besides their blocks.
    assert room == 12 * MIB - 12 * MIB // 100 - used
    budget.claim(paths["ws_a"] / "new", room - BLOCK, "a")  # fits
    with pytest.raises(DiskFull, match=r"the bot's disk is full: .* budget \(disk.budget_mb\)"):
        budget.claim(paths["ws_a"] / "more", 2 * BLOCK, "a")
    assert budget.total() == used + room - BLOCK  # the refused claim left no trace
    assert budget.room("a") == BLOCK


def test_a_channel_past_its_share_is_refused_while_others_still_write(tmp_path):
    data = tmp_path / "data"
    paths = layout(data)
    budget = DiskBudget(data, 100 * MIB, channel_percent=4)  # 4 MiB a channel
    budget.refresh()
    budget.bind("a", [paths["ws_a"], paths["st_a"]])
    budget.bind("b", [paths["ws_b"], paths["st_b"]])
    with pytest.raises(DiskFull, match="this channel has used its share"):
        budget.claim(paths["ws_a"] / "x", 2 * MIB, "a")  # a holds 3 MiB already
    budget.claim(paths["ws_b"] / "y", 512 * 1024, "b")  # b holds 3 MiB: half a MiB fits


def test_a_persons_channels_share_one_bound(tmp_path):
    data = tmp_path / "data"
    paths = layout(data)
    budget = DiskBudget(data, 100 * MIB, user_percent=7)  # 7 MiB a person
    budget.refresh()
    budget.bind("a", [paths["ws_a"], paths["st_a"]], owner="user-1")
    budget.bind("b", [paths["ws_b"], paths["st_b"]], owner="user-1")
    assert budget.owner_used("user-1") == budget.usage("a").channel + budget.usage("b").channel
    with pytest.raises(DiskFull, match="your channels .* have used your share"):
        budget.claim(paths["ws_b"] / "z", MIB + BLOCK, "b")
    assert budget.why_no_new("user-1") == ""  # room for a new thread's first files
    budget.claim(paths["ws_b"] / "z", 7 * MIB - budget.owner_used("user-1") - 100, "b")
    assert "your channels" in budget.why_no_new("user-1")  # but not now
    assert budget.why_no_new("user-2") == ""  # another person is not held by it


def test_claims_made_during_a_refresh_are_kept(tmp_path, monkeypatch):
    """A refresh walks for seconds; a write counted meanwhile must not vanish with the
    walk's older picture (it may be counted twice until the next one, never missed)."""
    data = tmp_path / "data"
    paths = layout(data)
    budget = DiskBudget(data, 100 * MIB)
    budget.refresh()
    walking, go_on = threading.Event(), threading.Event()
    import sandbox.disk_budget as module

    real = module.measure

    def slow(path: Path) -> int:
        walking.set()
        go_on.wait(5)
        return real(path)

    monkeypatch.setattr(module, "measure", slow)
    walker = threading.Thread(target=budget.refresh)
    walker.start()
    assert walking.wait(5)
    budget.claim(paths["ws_a"] / "during", 5 * MIB, "a")
    go_on.set()
    walker.join(10)
    assert budget.total() >= measure(data / "workspaces") + 5 * MIB


def test_the_sandbox_watch_stops_only_a_program_that_grew_past_the_budget(tmp_path):
    data = tmp_path / "data"
    paths = layout(data)
    budget = DiskBudget(data, 14 * MIB)
    budget.refresh()  # about 11 MiB
    budget.bind("a", [paths["ws_a"], paths["st_a"]])
    start = measure(paths["ws_a"])
    assert budget.watch(paths["ws_a"], start + MIB, grew=True) is None  # still under
    over = budget.watch(paths["ws_a"], start + 4 * MIB, grew=True)
    assert over and "disk is full" in over
    assert budget.watch(paths["ws_a"], start + 4 * MIB, grew=False) is None  # deleting runs on


def test_unbind_forgets_a_removed_workspace_and_its_usage(tmp_path):
    data = tmp_path / "data"
    paths = layout(data)
    budget = DiskBudget(data, 100 * MIB)
    before = budget.refresh()
    budget.bind("a", [paths["ws_a"], paths["st_a"]], owner="user-1")
    used = budget.usage("a").channel
    budget.unbind("a", [paths["ws_a"], paths["st_a"]])
    assert budget.total() == before - used
    assert budget.usage("a").channel == 0 and budget.owner_used("user-1") == 0


def test_the_report_shows_this_channel_and_sums_never_another_channels_name(tmp_path):
    data = tmp_path / "data"
    paths = layout(data)
    budget = DiskBudget(data, 100 * MIB, channel_percent=50)
    budget.refresh()
    budget.bind("a", [paths["ws_a"], paths["st_a"]], owner="user-1")
    budget.bind("b-secret", [paths["ws_b"], paths["st_b"]], owner="user-1")
    line = budget.report("a")
    assert "this channel uses 3.0 MiB of its 50.0 MiB share" in line
    assert "of its 100.0 MiB budget" in line
    assert "b-secret" not in line and "b-2" not in line
    assert "no budget" in DiskBudget(data, None).report("a")


def test_blocks_round_up_and_the_automatic_budget_leaves_free_space(tmp_path):
    assert blocks(0) == 0 and blocks(1) == BLOCK and blocks(BLOCK + 1) == 2 * BLOCK
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    auto = automatic_budget(tmp_path / "data", used=5 * MIB)
    assert 5 * MIB < auto < 5 * MIB + free
