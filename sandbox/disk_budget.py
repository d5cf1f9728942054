"""The data folder's disk budget: one total for all of it, a share per channel and per person.

Each workspace is bounded by its quota (``Limits.workspace_mb``), but nothing bounded the
sum: threads, DMs and practice attempts each made a new workspace, and the undo copies,
the cached images and the notes lay outside every quota. ``DiskBudget`` holds:

- the budget (``disk.budget_mb``) and two shares of it: what one channel may use (its
  workspace and its state folder, which holds its undo copies) and what one person's
  channels may use together (their DM, the threads they started);
- the usage, by area: each top-level entry of the data folder, and each workspace and
  each state folder on its own. ``refresh`` measures them all with ``usage_bytes`` (by
  folder descriptor, links not followed). It walks the tree, so the bot runs it in a
  thread every ``disk.refresh_s`` (``bot.runtime``), never on the event loop. Between two
  refreshes every write the bot makes is added as it is made (``claim``), and the
  sandbox's disk watch reports a workspace's size at each poll (``watch``). A refresh then
  replaces the sums, adding again what was claimed while it walked: a write may be
  counted twice until the next refresh, never missed, so the budget errs on the full side.

``claim`` is the one check before a write: it refuses a write that would take the data
folder past its budget, or a channel or a person past their share, with ``DiskFull`` (a
ValueError whose message says what is full, how full, and what to do), and counts it
otherwise, in one step under a lock, so two channels writing at once cannot both take the
last free bytes. Nothing already stored is ever deleted to make room.

A running program is stopped at the poll of the disk watch where writing as much again as
since the last one would pass a bound. Not bounded exactly: a program that writes in a burst
larger than its last poll's growth, or a poll that comes late on a loaded CPU, lets it pass
the bound by what it wrote meanwhile (each file is capped by RLIMIT_FSIZE); what it wrote is kept,
and every write after that is refused until usage is back under the budget. The store, the night's
files and the logs are counted but never refused: the budget stops what the agent and the
people it serves write, not the bot's own records.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sandbox.shared_limits import usage_bytes

# Folders of the data folder whose entries are areas of their own (one per channel).
SPLIT = ("workspaces", "channels")
# An automatic budget leaves this part of the disk's free space free (disk.budget_mb = 0).
FREE_KEPT = 0.1
BLOCK = 4096  # a file takes whole blocks: a 1-byte write still takes 4 KiB of the disk
# Writes are refused this far below the budget (a hundredth of it, at most 64 MiB): a write
# takes a little more than its file's blocks (a new folder, SQLite's journal, an index).
SLACK_PART, SLACK_MAX = 0.01, 64 * 2**20
NEAR = 256 * 2**20  # room under which a running program's workspace is polled more often


class DiskFull(ValueError):
    """A write refused by the budget or a share; the message says which and what to do."""


@dataclass(frozen=True)
class Usage:
    """One channel's view of the disk: its own use, its owner's, and the total (bytes)."""

    channel: int
    channel_share: int | None
    owner: int | None  # None: the channel has no owner (a server channel, the console)
    owner_share: int | None
    total: int
    budget: int | None


def blocks(size: int) -> int:
    """``size`` bytes rounded up to whole blocks, as the disk counts them."""
    return -(-size // BLOCK) * BLOCK


def size_text(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def measure(path: Path) -> int:
    """Disk space ``path`` takes: a file, or a folder with its tree; 0 when it is gone."""
    try:
        info = os.lstat(path)
    except OSError:
        return 0
    return info.st_blocks * 512 + (usage_bytes(path) if stat.S_ISDIR(info.st_mode) else 0)


def automatic_budget(data_dir: Path, used: int) -> int:
    """``disk.budget_mb = 0``: what the folder uses now plus nine tenths of the free space."""
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    return used + int(shutil.disk_usage(data_dir).free * (1 - FREE_KEPT))


class DiskBudget:
    """The budget, the shares and the cached usage; safe to call from any thread."""

    def __init__(self, data_dir: Path, budget_bytes: int | None, *,
                 channel_percent: float = 100.0, user_percent: float = 100.0) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.budget = budget_bytes
        self.channel_percent, self.user_percent = channel_percent, user_percent
        self._lock = threading.Lock()
        self._usage: dict[str, int] = {}
        self._total = 0
        self._during: dict[str, int] | None = None  # claims made while a refresh walks
        self._areas: dict[str, set[str]] = {}  # channel -> its areas
        self._owners: dict[str, str] = {}  # channel -> the person it counts against

    # --- shares ---

    def _limit(self) -> int:
        """Where writes stop: the budget, less the slack for what a write takes besides."""
        assert self.budget is not None
        return self.budget - min(int(self.budget * SLACK_PART), SLACK_MAX)

    def _share(self, percent: float) -> int | None:
        return None if self.budget is None else int(self.budget * percent / 100)

    @property
    def channel_share(self) -> int | None:
        return self._share(self.channel_percent)

    @property
    def user_share(self) -> int | None:
        return self._share(self.user_percent)

    # --- what belongs to whom ---

    def area(self, path: Path) -> str | None:
        """The area ``path`` counts in, or None outside the data folder. Workspaces and
        state folders are resolved paths; a configured path may not be, so it is
        resolved when it does not match as it is."""
        for form in (os.path.abspath, os.path.realpath):
            try:
                parts = Path(form(path)).relative_to(self.data_dir).parts
            except ValueError:
                continue
            if not parts:
                return None
            return "/".join(parts[:2]) if parts[0] in SPLIT and len(parts) > 1 else parts[0]
        return None

    def bind(self, channel: str, paths: Iterable[Path], owner: str | None = None) -> None:
        """Count ``paths`` (a workspace, a state folder) as ``channel``'s, and the channel
        as ``owner``'s."""
        areas = {a for a in map(self.area, paths) if a is not None}
        with self._lock:
            self._areas[channel] = areas
            if owner:
                self._owners[channel] = owner

    def unbind(self, channel: str, paths: Iterable[Path] = ()) -> None:
        """Forget a channel whose folders were removed, and their usage with it."""
        with self._lock:
            self._areas.pop(channel, None)
            self._owners.pop(channel, None)
            for area in filter(None, map(self.area, paths)):
                self._set(area, 0)

    # --- measuring ---

    def refresh(self) -> int:
        """Measure every area (walks the tree: call it in a thread); returns the total."""
        with self._lock:
            self._during = {}
        fresh: dict[str, int] = {}
        try:
            for path in _areas_on_disk(self.data_dir):
                fresh[self.area(path) or path.name] = measure(path)
        except BaseException:  # a walk cut short keeps the older, whole picture
            with self._lock:
                self._during = None
            raise
        with self._lock:
            during, self._during = self._during or {}, None
            for area, added in during.items():
                fresh[area] = fresh.get(area, 0) + added
            self._usage = fresh
            self._total = sum(fresh.values())
            return self._total

    def total(self) -> int:
        with self._lock:
            return self._total

    def _set(self, area: str, value: int) -> None:
        self._add(area, value - self._usage.get(area, 0))

    def _add(self, area: str, delta: int) -> None:
        self._usage[area] = max(0, self._usage.get(area, 0) + delta)
        self._total = sum(self._usage.values()) if delta < 0 else self._total + delta
        if self._during is not None and delta > 0:  # a removal the walk sees, or the next
            self._during[area] = self._during.get(area, 0) + delta

    def release(self, path: Path, freed: int) -> None:
        """``freed`` bytes of ``path``'s area were deleted (an evicted cached image)."""
        area = self.area(path)
        if area is not None:
            with self._lock:
                self._add(area, -freed)

    # --- the checks ---

    def claim(self, path: Path, growth: int, channel: str | None = None) -> None:
        """Count ``growth`` bytes about to be written under ``path``, on behalf of
        ``channel`` (None: the bot's own, e.g. a cached image); DiskFull if they do not fit."""
        area = self.area(path)
        if area is None or growth <= 0:
            return
        with self._lock:
            why = self._why_full(area, growth, channel)
            if why:
                raise DiskFull(why)
            self._add(area, growth)

    def watch(self, root: Path, used: int, grew: bool) -> str | None:
        """The sandbox's disk watch measured ``root`` at ``used`` bytes: count it, and say
        why the program must stop when it grew while the folder or a share is past its
        bound (None otherwise)."""
        area = self.area(root)
        if area is None:
            return None
        with self._lock:
            before = self._usage.get(area, 0)
            self._set(area, used)
            if not grew:
                return None
            # Stopped when the growth since the last poll, once more, would pass a bound:
            # the program writes on until the next poll, so waiting until it has passed
            # one let it overshoot by a poll's writes (5 MiB in the quota probes).
            ahead = max(0, used - before)
            channels = [c for c, areas in self._areas.items() if area in areas] or [None]
            return next(filter(None, (self._why_full(area, ahead, c) for c in channels)), None)

    def _why_full(self, area: str, growth: int, channel: str | None) -> str:
        def over(used: int, bound: int) -> bool:
            return used + growth > bound
        if self.budget is not None and over(self._total, self._limit()):
            return (f"the bot's disk is full: its data folder uses {size_text(self._total)} of "
                    f"its {size_text(self.budget)} budget (disk.budget_mb), so nothing more is "
                    "written. Delete files you no longer need, or ask an admin for room")
        if channel is None or area not in self._areas.get(channel, ()):
            return ""
        share, used = self.channel_share, self._sum(self._areas[channel])
        if share is not None and over(used, share):
            return (f"this channel has used its share of the bot's disk: {size_text(used)} of "
                    f"{size_text(share)} (disk.channel_share_percent of the budget), counting "
                    "its workspace and its undo copies. Delete files you no longer need")
        owner = self._owners.get(channel)
        share = self.user_share
        if owner and share is not None and over(used := self._owner_sum(owner), share):
            return _owner_full(used, share)
        return ""

    def _sum(self, areas: Iterable[str]) -> int:
        return sum(self._usage.get(a, 0) for a in areas)

    def _owner_sum(self, owner: str) -> int:
        areas = set().union(*(self._areas[c] for c, o in self._owners.items()
                              if o == owner and c in self._areas))
        return self._sum(areas)

    def owner_used(self, owner: str) -> int:
        with self._lock:
            return self._owner_sum(owner)

    def why_no_new(self, owner: str | None) -> str:
        """Why a new workspace for ``owner`` may not be made now ("" when it may): the data
        folder, or the owner's share, has no room left for even its first block."""
        with self._lock:
            why = self._why_full("", BLOCK, None)
            share = self.user_share
            if not why and owner and share is not None:
                used = self._owner_sum(owner)
                if used + BLOCK > share:
                    why = _owner_full(used, share)
            return why

    def room(self, channel: str | None = None) -> int | None:
        """Bytes ``channel`` may still write (None: no bound at all)."""
        with self._lock:
            bounds = []
            if self.budget is not None:
                bounds.append(self._limit() - self._total)
            if channel in self._areas and self.channel_share is not None:
                bounds.append(self.channel_share - self._sum(self._areas[channel]))
            owner = self._owners.get(channel or "")
            if owner and self.user_share is not None:
                bounds.append(self.user_share - self._owner_sum(owner))
        return max(0, min(bounds)) if bounds else None

    def poll_s(self, root: Path) -> float:
        """How often the sandbox's disk watch measures a running program's workspace at
        ``root``: five times as often when it is near a bound (the budget, or a share of
        a channel that uses it), where its writes between two polls are what may pass it."""
        area = self.area(root)
        with self._lock:
            channels = [c for c, areas in self._areas.items() if area in areas]
        rooms = [r for r in map(self.room, channels or [None]) if r is not None]
        return 0.05 if rooms and min(rooms) < NEAR else 0.25

    # --- what people see ---

    def usage(self, channel: str) -> Usage:
        with self._lock:
            own = self._sum(self._areas.get(channel, ()))
            owner = self._owners.get(channel)
            owned = self._owner_sum(owner) if owner else None
            return Usage(own, self.channel_share, owned, self.user_share if owner else None,
                         self._total, self.budget)

    def report(self, channel: str) -> str:
        """One line for /status and the health tool: this channel's use and the total.
        Never another channel's name: only sums over them."""
        u = self.usage(channel)
        share = f" of its {size_text(u.channel_share)} share" if u.channel_share else ""
        mine = f"this channel uses {size_text(u.channel)}{share}"
        if u.owner is not None:
            mine += f"; its owner's channels {size_text(u.owner)}"
            mine += f" of {size_text(u.owner_share)}" if u.owner_share else ""
        if u.budget is None:
            return f"{mine}; the data folder uses {size_text(u.total)} (no budget)"
        return (f"{mine}; the data folder uses {size_text(u.total)} of its "
                f"{size_text(u.budget)} budget ({100 * u.total / max(u.budget, 1):.0f}%)")


def _owner_full(used: int, share: int) -> str:
    return (f"your channels (your DMs and the threads you started) have used your share of "
            f"the bot's disk: {size_text(used)} of {size_text(share)} (disk.user_share_percent "
            "of the budget). Delete files you no longer need in one of them")


def _areas_on_disk(data_dir: Path) -> list[Path]:
    """The top-level entries of the data folder, with SPLIT folders' entries one by one."""
    found = []
    try:
        top = list(os.scandir(data_dir))
    except OSError:
        return []
    for entry in top:
        if entry.name in SPLIT and entry.is_dir(follow_symlinks=False):
            try:
                found += [Path(e.path) for e in os.scandir(entry.path)]
            except OSError:
                continue
        else:
            found.append(Path(entry.path))
    return found
