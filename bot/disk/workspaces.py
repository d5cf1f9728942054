"""The channel workspaces on disk: how many there are, whose they are, and which may go.

Every channel gets a workspace and a state folder the first time it is used
(``bot.channels.ChannelSpaces``): a Discord channel or thread, a DM, a console name, and
every practice and self-play attempt (``practice-...``, ``selfplay-...``). Nothing bounded
them: a person could open threads without end, and each attempt left its workspace behind
for good. ``Workspaces`` keeps one record per channel (its folders, its owner, when it was
made) in ``data_dir/workspaces.json`` (an attempt's only in memory: its folder's name says
what it is after a restart) and bounds them:

- their number: at most ``disk.max_workspaces`` folders under ``workspaces/``. A new one
  past it is refused (``SpaceRefused``, with a message saying so); existing ones are never
  touched for it;
- their disk: each channel's folders are bound to it and its owner in the ``DiskBudget``
  (``sandbox.disk_budget``), and a new workspace is refused when the data folder, or its
  owner's share, is full. The owner is the person a DM or a thread belongs to (the front
  end says; ``default_owner`` reads it from a DM's key), ``practice`` for practice and
  self-play attempts, and nobody for a server channel or the console (its channel share
  bounds it);
- throwaway workspaces. An attempt's workspace is its check's input and nothing's after.
  Once its attempt is judged, the runner retires it (``ChannelSpaces.retire``); any left
  from before a restart count as retired too (a run does not survive one). The newest
  ``disk.keep_practice_workspaces`` retired ones are kept for inspection, and ``reclaim``
  removes the older ones, by folder descriptor (``sandbox.paths.remove_entry``, so a link
  a job planted is removed as a link, never followed). It walks the trees, so the bot runs
  it in a thread, with the disk budget's refresh (``bot.disk.watch``), never on the event loop.

Nothing a person made is ever removed: only retired practice and self-play attempts.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sandbox.disk_budget import DiskBudget
from sandbox.paths import remove_entry
from tools.fsroot import atomic_write

logger = logging.getLogger("nightshift.workspaces")

THROWAWAY = ("practice-", "selfplay-")  # channel keys (and folder slugs) of attempts
PRACTICE_OWNER = "practice"


class SpaceRefused(Exception):
    """A new workspace that may not be made; the message says why and what to do."""


def default_owner(channel: str) -> str | None:
    """The owner a channel's key shows: a DM's person, or practice for an attempt."""
    if channel.startswith("dm-") and channel[3:].isdigit():
        return f"user-{channel[3:]}"
    return PRACTICE_OWNER if channel.startswith(THROWAWAY) else None


@dataclass
class Record:
    workspace: str  # the folder's name under workspaces/
    state: str  # the folder's name under channels/
    owner: str | None
    created: float
    throwaway: bool


class Workspaces:
    """The records, the bounds and the reclaiming; safe to call from any thread."""

    def __init__(self, data_dir: Path, budget: DiskBudget | None = None, *,
                 max_count: int | None = None, keep_throwaway: int = 100) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / "workspaces.json"
        self.budget, self.max_count, self.keep_throwaway = budget, max_count, keep_throwaway
        self._lock = threading.Lock()
        self._records = self._load()
        self._open: set[str] = set()  # channels in use in this process (not retired)
        self._removing: set[str] = set()  # workspace folders being reclaimed
        folder = self.data_dir / "workspaces"
        on_disk = set(os.listdir(folder)) if folder.is_dir() else set()
        # Folders made before these records existed count too, and are reclaimable when
        # their name shows a practice or self-play attempt.
        self._dirs = on_disk | {r.workspace for r in self._records.values()}
        if budget is not None:
            for channel, record in self._records.items():
                budget.bind(channel, self._paths(record), record.owner)

    def __len__(self) -> int:
        with self._lock:
            return len(self._dirs)

    def _paths(self, record: Record) -> list[Path]:
        return [self.data_dir / "workspaces" / record.workspace,
                self.data_dir / "channels" / record.state]

    def admit(self, channel: str, workspace: Path, state: Path, owner: str | None) -> None:
        """Record ``channel`` as in use, with its folders; a new workspace is checked
        against the bounds first (SpaceRefused)."""
        owner = owner or default_owner(channel)
        with self._lock:
            if workspace.name in self._removing:
                raise SpaceRefused(f"#{channel}'s old workspace is being removed; try again "
                                   "in a moment")
            record = self._records.get(channel)
            if record is None:
                if workspace.name not in self._dirs:
                    self._check_new(owner)
                record = Record(workspace.name, state.name, owner, time.time(),
                                channel.startswith(THROWAWAY))
                self._records[channel] = record
                self._dirs.add(workspace.name)
                if not record.throwaway:  # an attempt's folder is known by its name after
                    self._save()  # a restart: no rewrite of the file for each attempt
            self._open.add(channel)
        if self.budget is not None:
            self.budget.bind(channel, self._paths(record), record.owner)

    def _check_new(self, owner: str | None) -> None:
        if self.max_count is not None and len(self._dirs) >= self.max_count:
            raise SpaceRefused(
                f"no new workspace can be made: the bot keeps {len(self._dirs)} workspaces, "
                f"the most it may (disk.max_workspaces). Use an existing channel, or ask an "
                "admin to raise the limit or remove old workspaces")
        why = self.budget.why_no_new(owner) if self.budget is not None else ""
        if why:
            raise SpaceRefused(why)

    def retire(self, channel: str) -> None:
        """A practice or self-play attempt was judged: its workspace may go (``reclaim``)."""
        with self._lock:
            self._open.discard(channel)

    # --- reclaiming ---

    def reclaim(self) -> int:
        """Remove the retired attempts' folders beyond the newest ``keep_throwaway``
        (blocking: call it in a thread); returns how many workspaces went."""
        with self._lock:
            victims = self._victims()
            self._removing |= {name for name, _ in victims}
        gone: set[str] = set()
        try:
            for name, state in victims:
                if self._remove(name, state):
                    gone.add(name)
        finally:
            with self._lock:
                self._removing -= {name for name, _ in victims}
                for channel in [c for c, r in self._records.items() if r.workspace in gone]:
                    record = self._records.pop(channel)
                    if self.budget is not None:
                        self.budget.unbind(channel, self._paths(record))
                self._dirs -= gone
                if gone:
                    self._save()
        return len(gone)

    def _victims(self) -> list[tuple[str, str]]:
        """(workspace, state folder) of the reclaimable attempts past the kept ones,
        oldest first. A folder that any open channel uses is never among them."""
        in_use = {self._records[c].workspace for c in self._open if c in self._records}
        known: dict[str, Record] = {}
        for record in self._records.values():
            known[record.workspace] = record
        candidates = []
        for name in self._dirs - in_use - self._removing:
            record = known.get(name)
            if record is not None and record.throwaway:
                candidates.append((record.created, name, record.state))
            elif record is None and name.startswith(THROWAWAY):  # from before the records
                candidates.append((0.0, name, name))
        candidates.sort()
        extra = len(candidates) - self.keep_throwaway
        return [(name, state) for _, name, state in candidates[:max(0, extra)]]

    def _remove(self, name: str, state: str) -> bool:
        """Remove one attempt's workspace and state folder, through descriptors."""
        try:
            for parent, entry in (("workspaces", name), ("channels", state)):
                # The parent is the host's own folder (it may be a link the operator made);
                # every entry below it is removed without following a link.
                fd = os.open(self.data_dir / parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    remove_entry(fd, entry)
                finally:
                    os.close(fd)
        except OSError as exc:  # logged; the next reclaim tries again
            logger.warning("could not remove the workspace %s: %s", name, exc)
            return False
        return True

    # --- the records file ---

    def _load(self) -> dict[str, Record]:
        try:
            raw = json.loads(self.path.read_text())
            return {channel: Record(**fields) for channel, fields in raw["channels"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError) as exc:
            # Never fatal, and never a reason to remove anything: unknown folders are only
            # counted, and only attempts' folders (by name) are ever reclaimed.
            logger.warning("%s is unreadable (%s); starting its records afresh", self.path, exc)
            return {}

    def _save(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        data = {"version": 1, "channels": {c: asdict(r) for c, r in self._records.items()}}
        atomic_write(self.path, json.dumps(data).encode())
