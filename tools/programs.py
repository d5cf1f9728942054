"""Running the agent's programs (Python, git) in the sandbox, and journaling what they change.

Tools never start a process themselves: they go through the ``Sandbox`` the
bot injected as ``ctx.services.sandbox`` (a default ``Sandbox()`` when
none was), and a missing bubblewrap becomes a refusal that says how to fix it.

A program's file changes cannot go through a journal ``Transaction``: that
must be told which paths will change before they do, and a program's paths
are known only afterwards. So ``ProgramChanges`` brackets the run instead:

- before: it walks the workspace (never following a link) and makes sure the
  journal's blob store holds the content of every file. An index of
  (inode, size, mtime, ctime) -> SHA-256 in ``state_dir/program_index.json``
  means only files changed since the last walk are read again.
- after: it walks again, reads the files whose signature changed, and records
  every difference (created, modified, deleted files, links and folders) as
  one journal entry. ``undo`` then reverts what the program did, and refuses,
  as for every entry, when a path changed again since.

Bounds and blind spots, said plainly:

- Not recorded: the top-level ``.git/`` (git's own history is its undo) and
  ``jobs/`` (background job output, see tools.python_jobs); FIFOs, sockets
  and devices; file modes (as the journal never records them).
- A workspace with more than ``MAX_TRACKED_FILES`` entries or more file bytes
  than the journal's snapshot limit (256 MiB), or whose new copies the data
  folder's budget has no room for (``sandbox.disk_budget``), is not recorded:
  the run goes ahead and says that undo cannot revert it. The blob store then holds one
  copy of the workspace's files, which is the price of undoing a program.
- A background job writing at the same time is indistinguishable from the
  program: its changes in that window join the program's entry.
- Change detection trusts the (inode, size, mtime, ctime) signature; ctime
  cannot be set by a program, so a changed file is always seen.

This module builds the journal entry from ``Change`` records and appends it
with ``Journal.record``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import stat
from pathlib import Path

from sandbox.bwrap import missing_message
from sandbox.disk_budget import DiskFull, blocks
from sandbox.paths import MOUNT_POINT, PathEscape
from sandbox.process import ProcessResult, Sandbox, SandboxUnavailable
from tools import ToolContext, ToolError
from tools.fsroot import DIR_FLAGS, FsRoot, atomic_write
from tools.journal import ABSENT, DIR, WORKSPACE, Change, State

# Top-level names a program's journal entry leaves out.
UNTRACKED = (".git", "jobs")
MAX_TRACKED_FILES = 20_000
INDEX_FILE = "program_index.json"

Sig = tuple[int, int, int, int]  # inode, size, mtime_ns, ctime_ns
Found = dict[str, tuple]  # rel -> ("dir",) | ("link", target) | ("file", Sig)


# --- the sandbox service ---


def sandbox_of(ctx: ToolContext) -> Sandbox:
    """The channel's sandbox: the injected one, else a default made once and kept."""
    box = ctx.services.sandbox
    if box is None:
        box = ctx.services.sandbox = Sandbox()
    return box


def with_timeout(box: Sandbox, timeout_s: float) -> Sandbox:
    """``box`` with its per-process CPU limit raised to the wall-clock timeout, if lower.

    Otherwise RLIMIT_CPU (30 s by default) would end a long job long before its
    timeout does. Everything else (memory, files, processes) stays as configured.
    """
    if not isinstance(box, Sandbox) or box.limits.cpu_s >= timeout_s:
        return box
    raised = copy.copy(box)
    raised.limits = dataclasses.replace(box.limits, cpu_s=math.ceil(timeout_s))
    return raised


def refusal(exc: SandboxUnavailable) -> ToolError:
    return ToolError(f"code cannot run on this machine: {exc} Until an admin fixes this, "
                     f"run_python, the background jobs and the git tools are unavailable.")


def check_available(box: Sandbox) -> None:
    """Refuse up front (``ToolError``) when the sandbox would raise SandboxUnavailable."""
    if getattr(box, "bwrap", "") is None and not getattr(box, "allow_unsandboxed", False):
        raise refusal(SandboxUnavailable(missing_message()))


def refuse_when_full(ctx: ToolContext) -> None:
    """A program is not started when the data folder's budget (or this channel's or its
    person's share) has no room left: the disk watch would stop it only at its first poll,
    after what it wrote by then had passed the bound (16 MiB in the quota probe)."""
    disk = ctx.services.disk
    if disk is not None and (room := disk.room(ctx.channel)) is not None and room <= 0:
        raise ToolError(f"not started: the disk is full ({disk.report(ctx.channel)}); there "
                        "is no room for a program's output: delete files you no longer need first")


async def run_program(ctx: ToolContext, argv: list[str], *, timeout_s: float,
                      env: dict[str, str] | None = None) -> ProcessResult:
    """Run ``argv`` in the channel's workspace; a missing sandbox or a full disk budget is a
    ToolError."""
    refuse_when_full(ctx)
    box = with_timeout(sandbox_of(ctx), timeout_s)
    try:
        return await box.run(argv, ctx.workspace, timeout_s=timeout_s, env=env)
    except SandboxUnavailable as exc:
        raise refusal(exc) from None


def workspace_in_sandbox(ctx: ToolContext) -> str:
    """Where the program sees the workspace: /workspace, or the host path when unsandboxed."""
    return str(MOUNT_POINT) if getattr(sandbox_of(ctx), "sandboxed", True) else str(ctx.workspace.root)


def clip(text: str, limit: int) -> str:
    """At most ``limit`` characters: the head and the tail, with a note of what was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


# --- journaling what a program changed ---


class ProgramChanges:
    """The workspace before and after one program run, recorded as one journal entry.

    ``before()`` and ``after()`` read and hash files: call them off the event loop.
    """

    def __init__(self, ctx: ToolContext, label: str) -> None:
        self.ctx = ctx
        self.label = label
        self.journal = ctx.journal
        self.fs = FsRoot(ctx.workspace.root)
        self._index_path = Path(ctx.state_dir) / INDEX_FILE
        self._index = _load_index(self._index_path)
        self._before: dict[str, State] | None = None
        self._sigs: dict[str, Sig] = {}
        self.why_not = ""  # why this run is not journaled, when it is not

    def before(self) -> None:
        found = _walk(self.fs, MAX_TRACKED_FILES)
        if found is None:
            self.why_not = f"your workspace holds more than {MAX_TRACKED_FILES} files and folders"
            return
        size = sum(info[1][1] for info in found.values() if info[0] == "file")
        if size > self.journal.max_snapshot_bytes:
            self.why_not = (f"your workspace holds more than "
                            f"{self.journal.max_snapshot_bytes // 2**20} MiB of files")
            return
        if not self._room_for(self._unsaved(found)):
            self.why_not = "the bot's disk budget has no room for undo copies of your files"
            return
        self._before = self._states(found)
        self._save_index()

    def _unsaved(self, found: Found) -> int:
        """Bytes of the files whose content the blob store does not hold yet."""
        total = 0
        for rel, info in found.items():
            known = self._index.get(rel)
            if info[0] == "file" and not (known and tuple(known[:4]) == info[1]
                                          and self.journal.has_blob(known[4])):
                total += blocks(info[1][1])
        return total

    def _room_for(self, size: int) -> bool:
        """Count ``size`` bytes of undo copies in the channel's share; False when they do
        not fit (the copies live in its state folder, outside the workspace quota)."""
        disk = self.ctx.services.disk
        try:
            if disk is not None:
                disk.claim(self.journal.dir, size, self.ctx.channel)
        except DiskFull:
            return False
        return True

    def after(self) -> str:
        """Record the differences; returns a line for the tool's output ("" when nothing changed)."""
        if self._before is None:
            return (f"note: {self.why_not}, so the files this run changed are not journaled: "
                    f"undo cannot revert them.")
        found = _walk(self.fs, MAX_TRACKED_FILES)
        if found is None:
            return (f"note: the run left more than {MAX_TRACKED_FILES} files and folders, so its "
                    f"changes are not journaled: undo cannot revert them.")
        fresh = [rel for rel, info in found.items() if info[0] == "file" and self._sigs.get(rel) != info[1]]
        size = sum(found[rel][1][1] for rel in fresh)
        if size > self.journal.max_snapshot_bytes:
            return (f"note: the run wrote more than {self.journal.max_snapshot_bytes // 2**20} MiB, "
                    f"so its changes are not journaled: undo cannot revert them.")
        if not self._room_for(sum(blocks(found[rel][1][1]) for rel in fresh)):
            return ("note: the bot's disk budget has no room for undo copies of what the run "
                    "wrote, so its changes are not journaled: undo cannot revert them.")
        after = self._states(found)
        self._save_index()
        keys = sorted(set(self._before) | set(after))
        changes = [Change((WORKSPACE, rel), self._before.get(rel, ABSENT), after.get(rel, ABSENT))
                   for rel in keys]
        changes = [c for c in changes if c.before != c.after]
        if not changes:
            return ""
        self.journal.record(self.label, changes)
        return _describe(changes)

    def _states(self, found: Found) -> dict[str, State]:
        """The journal states of ``found``, saving each file's content as a blob."""
        states: dict[str, State] = {}
        sigs: dict[str, Sig] = {}
        for rel, info in found.items():
            if info[0] == "dir":
                states[rel] = DIR
            elif info[0] == "link":
                states[rel] = State("link", info[1])
            else:
                digest = self._blob_for(rel, info[1])
                if digest is not None:
                    states[rel], sigs[rel] = State("file", digest), info[1]
        self._sigs = sigs
        return states

    def _blob_for(self, rel: str, sig: Sig) -> str | None:
        """The SHA-256 of a file whose content the blob store holds; None if it vanished."""
        known = self._index.get(rel)
        if known and tuple(known[:4]) == sig and self.journal.has_blob(known[4]):
            return known[4]
        try:
            digest = self.journal.save_blob(self.fs.read(rel))
        except (FileNotFoundError, NotADirectoryError, PathEscape):
            return None  # removed or swapped for a link while we looked: not a file any more
        self._index[rel] = [*sig, digest]
        return digest

    def _save_index(self) -> None:
        kept = {rel: self._index[rel] for rel in self._sigs if rel in self._index}
        self._index = kept
        atomic_write(self._index_path, json.dumps(kept).encode())


def _load_index(path: Path) -> dict[str, list]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _walk(fs: FsRoot, limit: int) -> Found | None:
    """Every path in the workspace but the UNTRACKED top-level names; None past ``limit``."""
    found: Found = {}
    pending = [""]
    while pending:
        folder = pending.pop()
        try:
            listing = _list(fs, folder)
        except (FileNotFoundError, NotADirectoryError, PathEscape):
            continue  # removed, or swapped for a link, while we walked
        for name, st, target in listing:
            rel = f"{folder}/{name}" if folder else name
            if not folder and name in UNTRACKED:
                continue
            if stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir",)
                pending.append(rel)
            elif stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", target)
            elif stat.S_ISREG(st.st_mode):
                found[rel] = ("file", (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
            if len(found) > limit:
                return None
    return found


def _list(fs: FsRoot, rel: str) -> list[tuple[str, os.stat_result, str]]:
    """A folder's entries with their own status (links not followed) and link targets."""
    if rel:
        with fs.parent(rel) as (parent_fd, name):
            fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    else:
        fd = os.open(fs.root, DIR_FLAGS)
    try:
        out = []
        with os.scandir(fd) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                target = os.readlink(entry.name, dir_fd=fd) if stat.S_ISLNK(st.st_mode) else ""
                out.append((entry.name, st, target))
        return out
    finally:
        os.close(fd)


def _describe(changes: list[Change]) -> str:
    words = []
    for c in changes:
        slash = "/" if DIR in (c.before, c.after) else ""
        verb = ("created" if c.before.kind == "absent" else
                "deleted" if c.after.kind == "absent" else "changed")
        words.append(f"{verb} {c.key[1]}{slash}")
    more = f", and {len(words) - 10} more" if len(words) > 10 else ""
    return (f"files changed in your workspace (journaled; undo reverts them): "
            f"{', '.join(words[:10])}{more}")
