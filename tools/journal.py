"""The per-channel undo/redo journal (the undo, redo and history tools are in tools.history).

Every change the tools make to a channel's workspace or to its system-prompt
section runs inside ``Journal.change(label)`` and goes through the
transaction's ``write``/``mkdir``/``remove`` (or ``touch`` before a custom
change). On exit the journal compares the touched trees before and after and
records one entry with, per path, the before and after state
(absent, a folder, a link, or a file named by the SHA-256 of its bytes).
File contents live once each in a content-addressed blob store, so undoing a
deleted folder restores every file in it.

Undo only undoes what the journal did: it first checks that every path is
still exactly as the entry left it and refuses, naming the path, when
something else (a Python job, the user) changed it since. Redo makes the same
check against the before state. A new change drops the redo stack.

On disk, under ``state_dir/journal/`` (outside the workspace, out of the
agent's reach): ``head.json`` (the done and undone stacks), one
``entries/<id>.json`` per entry and ``blobs/<ab>/<sha256>``. Every write is a
temp file plus ``os.replace``, and ``head.json`` is written last, so a crash
leaves either the old or the new state; an undo interrupted between its file
writes and the head update is detected (the paths already match) and simply
completes. History is trimmed to ``keep`` entries, and blobs no entry uses are
then collected. Not recorded: file modes and timestamps.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from sandbox.shared_limits import over_quota_message, usage_bytes
from tools.fsroot import FsRoot, atomic_write
from tools.schema import ToolError

# Past this many bytes in one entry's snapshots a change is refused: undo must stay cheap.
MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
# Trim in batches, so the blob sweep runs once per TRIM_SLACK changes, not on every one.
TRIM_SLACK = 50

WORKSPACE, STATE = "ws", "state"
Key = tuple[str, str]  # (WORKSPACE | STATE, posix path relative to that root)


class JournalConflict(ValueError):
    """Undo or redo would overwrite a change the journal did not make."""


class SnapshotTooLarge(ValueError):
    """A change would snapshot more than the journal's byte limit."""


class State(NamedTuple):
    kind: str  # "absent" | "file" | "dir" | "link"
    ref: str = ""  # a file's SHA-256, a link's target


ABSENT, DIR = State("absent"), State("dir")


@dataclass(frozen=True)
class Change:
    key: Key
    before: State
    after: State


@dataclass(frozen=True)
class Entry:
    id: int
    label: str
    time: float
    changes: tuple[Change, ...]


class Journal:
    """One channel's change history; every method reads its state from disk first."""

    def __init__(self, state_dir: Path, workspace_root: Path, *, keep: int = 500,
                 max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES,
                 quota_bytes: int | None = None, history_bytes: int | None = None) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.root = Path(workspace_root).resolve()
        if self.state_dir == self.root or self.root in self.state_dir.parents:
            raise ValueError(f"the journal's state dir {self.state_dir} must lie outside the workspace")
        self.dir = self.state_dir / "journal"
        self._fs = {WORKSPACE: FsRoot(self.root), STATE: FsRoot(self.state_dir)}
        self.keep = keep
        self.max_snapshot_bytes = max_snapshot_bytes
        self.quota_bytes = quota_bytes  # the workspace's disk quota; writes past it are refused
        # The most disk the saved contents may take: past it the oldest entries go (each
        # run_python may journal 256 MiB, and only the entry count bounded them).
        self.history_bytes = history_bytes
        (self.dir / "entries").mkdir(parents=True, exist_ok=True)
        (self.dir / "blobs").mkdir(exist_ok=True)

    # --- recording ---

    def change(self, label: str) -> Transaction:
        """``with journal.change("write_file a.txt") as tx: tx.write(path, data)``."""
        return Transaction(self, label)

    def record(self, label: str, changes: list[Change]) -> None:
        """Append one entry made elsewhere from before/after snapshots (a program's run,
        a git checkout). The states' file contents must already be saved with
        ``save_blob``. Entries that were undone are dropped: a new change ends redo."""
        head = self._read_head()
        entry = Entry(head["next_id"], label, time.time(), tuple(changes))
        atomic_write(self._entry_path(entry.id), _dump_entry(entry))
        dropped = head["undone"]
        done = head["done"] + [entry.id]
        trimmed = done[:-self.keep] if len(done) > self.keep + TRIM_SLACK else []
        self._write_head(entry.id + 1, done[len(trimmed):], [])
        for entry_id in dropped + trimmed:
            self._entry_path(entry_id).unlink(missing_ok=True)
        if trimmed or dropped:
            self._collect_blobs()
        self._fit_history()

    def _fit_history(self) -> None:
        """Drop the oldest entries, a quarter at a time, until the saved contents fit
        ``history_bytes``. The newest entry always stays: its undo is the one people ask
        for, and its size was already bounded by ``max_snapshot_bytes``."""
        if self.history_bytes is None:
            return
        while usage_bytes(self.dir / "blobs") > self.history_bytes:
            head = self._read_head()
            if len(head["done"]) <= 1:
                return
            oldest = head["done"][:max(1, (len(head["done"]) - 1) // 4)]
            self._write_head(head["next_id"], head["done"][len(oldest):], head["undone"])
            for entry_id in oldest:
                self._entry_path(entry_id).unlink(missing_ok=True)
            self._collect_blobs()

    # --- undo / redo ---

    def undo(self) -> str:
        """Revert the latest entry; raises JournalConflict if its paths changed since."""
        head = self._read_head()
        if not head["done"]:
            raise ToolError("nothing to undo: the journal has no changes left to revert")
        entry = self._read_entry(head["done"][-1])
        summary = self._apply(entry, forward=False)
        self._write_head(head["next_id"], head["done"][:-1], head["undone"] + [entry.id])
        return f"undid #{entry.id} ({entry.label}): {summary}"

    def redo(self) -> str:
        """Re-apply the latest undone entry; raises JournalConflict if its paths changed since."""
        head = self._read_head()
        if not head["undone"]:
            raise ToolError("nothing to redo: no undone change is waiting (a new change clears redo)")
        entry = self._read_entry(head["undone"][-1])
        summary = self._apply(entry, forward=True)
        self._write_head(head["next_id"], head["done"] + [entry.id], head["undone"][:-1])
        return f"redid #{entry.id} ({entry.label}): {summary}"

    def log(self, limit: int = 10) -> tuple[list[Entry], list[Entry]]:
        """The latest ``limit`` done entries and the undone ones, newest first."""
        head = self._read_head()
        done = [self._read_entry(i) for i in reversed(head["done"][-limit:])]
        undone = [self._read_entry(i) for i in reversed(head["undone"][-limit:])]
        return done, undone

    def _apply(self, entry: Entry, *, forward: bool) -> str:
        expect = {c.key: (c.before if forward else c.after) for c in entry.changes}
        target = {c.key: (c.after if forward else c.before) for c in entry.changes}
        current = {key: self._current(key) for key in expect}
        if current == target:  # an earlier attempt wrote the files but not the head
            return _summary(expect, target)
        verb = "redo" if forward else "undo"
        for key, state in expect.items():
            if current[key] != state:
                now = current[key]
                how = ("its content differs from what that change left" if now.kind == state.kind == "file"
                       else f"it is now {_describe(now)}, expected {_describe(state)}")
                raise JournalConflict(
                    f"cannot {verb} #{entry.id} ({entry.label}): {_name(key)} changed outside the "
                    f"journal since; {how}. Nothing was changed. Inspect it, then edit it by hand.")
        self._check_room(entry, expect, target, verb)
        depth = lambda key: (key[1].count("/"), key)  # noqa: E731
        for key in sorted(expect, key=depth, reverse=True):
            was, will, fs = expect[key], target[key], self._fs[key[0]]
            if was.kind != will.kind or (was.kind == "link" and was != will):
                if was.kind == "dir":
                    fs.rmdir(key[1])  # empty by now: _check_room saw every child in the entry
                elif was.kind != "absent":
                    fs.unlink(key[1])
        for key in sorted(expect, key=depth):
            was, will, fs = expect[key], target[key], self._fs[key[0]]
            if will.kind == "dir" and was.kind != "dir":
                fs.mkdir(key[1])
            elif will.kind == "file" and was != will:
                fs.write(key[1], self._blob_path(will.ref).read_bytes())
            elif will.kind == "link" and was != will:
                fs.symlink(will.ref, key[1])
        return _summary(expect, target)

    def _check_room(self, entry: Entry, expect: dict, target: dict, verb: str) -> None:
        """Refuse before touching anything if the entry cannot be applied cleanly."""
        for key, will in target.items():
            if expect[key].kind == "dir" and will.kind != "dir":
                for child in self._walk_keys(key):
                    if child not in expect:
                        raise JournalConflict(
                            f"cannot {verb} #{entry.id} ({entry.label}): {_name(key)} now also holds "
                            f"{_name(child)}, which that change did not make. Nothing was changed.")
            parent = (key[0], key[1].rpartition("/")[0])
            if will.kind != "absent" and parent[1]:
                ok = target[parent].kind == "dir" if parent in target else self._kind(parent) == "dir"
                if not ok:
                    raise JournalConflict(f"cannot {verb} #{entry.id} ({entry.label}): the folder "
                                          f"{_name(parent)} is gone, so {_name(key)} cannot be "
                                          f"restored. Nothing was changed.")
            if will.kind == "file" and not self._blob_path(will.ref).is_file():
                raise JournalConflict(f"cannot {verb} #{entry.id} ({entry.label}): the journal lost "
                                      f"the saved copy of {_name(key)}. Nothing was changed.")

    # --- paths, states, blobs ---

    def _key(self, path: Path) -> Key:
        path = Path(os.path.abspath(path))
        for root_name, root in ((WORKSPACE, self.root), (STATE, self.state_dir)):
            if path == root:
                raise ValueError(f"the journal cannot record the whole of {root}")
            if root in path.parents:
                rel = path.relative_to(root).as_posix()
                if root_name == STATE and (rel == "journal" or rel.startswith("journal/")):
                    break
                return root_name, rel
        raise ValueError(f"{path} is outside what the journal records")

    def _kind(self, key: Key) -> str:
        st = self._fs[key[0]].lstat(key[1])
        if st is None:
            return "absent"
        if stat.S_ISDIR(st.st_mode):
            return "dir"
        if stat.S_ISLNK(st.st_mode):
            return "link"
        return "file" if stat.S_ISREG(st.st_mode) else "special"

    def _current(self, key: Key) -> State:
        """A path's state, hashing files but storing nothing."""
        kind, fs = self._kind(key), self._fs[key[0]]
        if kind == "file":
            return State("file", hashlib.sha256(fs.read(key[1])).hexdigest())
        if kind == "link":
            return State("link", fs.readlink(key[1]))
        return State(kind)

    def _walk_keys(self, key: Key) -> list[Key]:
        """Every path below a folder key, without following links."""
        keys, stack = [], [key]
        while stack:
            parent = stack.pop()
            if self._kind(parent) != "dir":
                continue
            for name in self._fs[parent[0]].listdir(parent[1]):
                child = (parent[0], f"{parent[1]}/{name}")
                keys.append(child)
                stack.append(child)
        return keys

    def _snapshot(self, key: Key, into: dict[Key, State], budget: list[int],
                  skip: frozenset[Key] = frozenset()) -> None:
        """Record the states of ``key`` and everything below it, saving file contents as blobs."""
        fs = self._fs[key[0]]
        for k in [key, *self._walk_keys(key)]:
            if k in skip or any((k[0], p) in skip for p in _ancestors(k[1])):
                continue
            st = fs.lstat(k[1])
            if st is None:
                state = ABSENT
            elif stat.S_ISDIR(st.st_mode):
                state = DIR
            elif stat.S_ISLNK(st.st_mode):
                state = State("link", fs.readlink(k[1]))
            elif stat.S_ISREG(st.st_mode):
                budget[0] -= st.st_size
                if budget[0] < 0:
                    raise SnapshotTooLarge(
                        f"this change would have the journal save more than "
                        f"{self.max_snapshot_bytes // 2**20} MiB (at {_name(k)}), too much to undo; "
                        f"work on smaller parts (e.g. delete subfolders one by one)")
                state = State("file", self.save_blob(fs.read(k[1])))
            else:
                raise ValueError(f"{_name(k)} is not a regular file, folder or link; "
                                 f"the journal cannot record it")
            into.setdefault(k, state)

    def has_blob(self, digest: str) -> bool:
        return self._blob_path(digest).is_file()

    def save_blob(self, data: bytes) -> str:
        """Store ``data`` once by its SHA-256 (the reference a file state holds)."""
        digest = hashlib.sha256(data).hexdigest()
        path = self._blob_path(digest)
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            atomic_write(path, data)
        return digest

    def _blob_path(self, digest: str) -> Path:
        return self.dir / "blobs" / digest[:2] / digest

    def _collect_blobs(self) -> None:
        head = self._read_head()
        used = {s.ref for i in head["done"] + head["undone"] for c in self._read_entry(i).changes
                for s in (c.before, c.after) if s.kind == "file"}
        for blob in (self.dir / "blobs").glob("*/*"):
            if blob.name not in used and not blob.name.endswith(".tmp"):
                blob.unlink(missing_ok=True)

    # --- persistence ---

    def _read_head(self) -> dict:
        try:
            return json.loads((self.dir / "head.json").read_text())
        except FileNotFoundError:
            return {"next_id": 1, "done": [], "undone": []}

    def _write_head(self, next_id: int, done: list[int], undone: list[int]) -> None:
        head = {"version": 1, "next_id": next_id, "done": done, "undone": undone}
        atomic_write(self.dir / "head.json", json.dumps(head).encode())

    def _entry_path(self, entry_id: int) -> Path:
        return self.dir / "entries" / f"{entry_id:08d}.json"

    def _read_entry(self, entry_id: int) -> Entry:
        raw = json.loads(self._entry_path(entry_id).read_text())
        changes = tuple(Change((root, rel), State(*before), State(*after))
                        for root, rel, before, after in raw["changes"])
        return Entry(raw["id"], raw["label"], raw["time"], changes)


class Transaction:
    """One journal entry in the making; see ``Journal.change``."""

    def __init__(self, journal: Journal, label: str) -> None:
        self.journal = journal
        self.label = label
        self._before: dict[Key, State] = {}
        self._tops: list[Key] = []
        self._budget = [journal.max_snapshot_bytes]
        self._used: int | None = None  # the workspace's usage, measured at the first write

    def touch(self, path: Path) -> Key:
        """Snapshot ``path`` (and its subtree) before the caller changes it; returns its key.

        Touch every path before changing any: a missing parent folder the
        change may create is covered by recording its highest missing ancestor.
        """
        key = top = self.journal._key(path)
        for parent in reversed(_ancestors(key[1])):  # deepest first
            if self.journal._kind((key[0], parent)) != "absent":
                break
            top = (key[0], parent)
        covered = any(top == t or (t[0] == top[0] and t[1] in _ancestors(top[1])) for t in self._tops)
        if not covered:
            self.journal._snapshot(top, self._before, self._budget, skip=frozenset(self._tops))
            self._tops.append(top)
        return key

    def write(self, path: Path, data: bytes) -> None:
        """Write a file (creating missing folders), recorded; refused past the quota."""
        self._check_quota(path, len(data))
        root, rel = self.touch(path)
        self.journal._fs[root].write(rel, data, parents=True)

    def _check_quota(self, path: Path, size: int) -> None:
        quota = self.journal.quota_bytes
        root, _ = self.journal._key(path)
        if quota is None or root != WORKSPACE:
            return
        if self._used is None:
            self._used = usage_bytes(self.journal.root)
        try:
            info = os.lstat(path)
            old = info.st_blocks * 512 if stat.S_ISREG(info.st_mode) else 0
        except OSError:
            old = 0
        after = self._used - old + size
        if size > old and after > quota:
            raise ToolError(over_quota_message(after, quota))
        self._used = after

    def mkdir(self, path: Path) -> None:
        """Create a folder and any missing parents, recorded."""
        root, rel = self.touch(path)
        self.journal._fs[root].mkdir(rel, parents=True)

    def remove(self, path: Path) -> None:
        """Delete a file, a link (not its target) or a whole folder, recorded."""
        root, rel = self.touch(path)
        self.journal._fs[root].remove(rel)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Record even when the tool failed halfway: whatever it did change stays undoable.
        after: dict[Key, State] = {}
        for top in self._tops:
            self.journal._snapshot(top, after, [2**62])
        keys = sorted(set(self._before) | set(after))
        changes = [Change(k, self._before.get(k, ABSENT), after.get(k, ABSENT)) for k in keys]
        changes = [c for c in changes if c.before != c.after]
        if changes:
            self.journal.record(self.label, changes)


def _ancestors(rel: str) -> list[str]:
    """``"a/b/c"`` -> ``["a", "a/b"]``: the proper ancestors, shallowest first."""
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _dump_entry(entry: Entry) -> bytes:
    changes = [[c.key[0], c.key[1], list(c.before), list(c.after)] for c in entry.changes]
    return json.dumps({"id": entry.id, "label": entry.label, "time": entry.time,
                       "changes": changes}).encode()


def _name(key: Key) -> str:
    if key[0] == STATE:
        return "your system-prompt section" if key[1] == "system.md" else f"state file {key[1]}"
    return key[1]


def _describe(state: State) -> str:
    return {"absent": "absent", "dir": "a folder", "link": f"a link to {state.ref}",
            "special": "a special file (not a regular file, folder or link)"}.get(
        state.kind, f"a file with content sha256:{state.ref[:10]}")


def _summary(expect: dict[Key, State], target: dict[Key, State]) -> str:
    words = []
    for key in sorted(expect):
        verb = ("removed" if target[key].kind == "absent" else
                "recreated" if expect[key].kind == "absent" else "restored")
        words.append(f"{verb} {_name(key)}{'/' if DIR in (expect[key], target[key]) else ''}")
    more = f", and {len(words) - 8} more" if len(words) > 8 else ""
    return ", ".join(words[:8]) + more
