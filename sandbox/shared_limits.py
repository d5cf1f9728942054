"""Limits over all sandboxed runs together: disk per workspace, memory in total.

The rlimits in ``sandbox.process`` bound one process each. These bound the sum:

- Disk: ``usage_bytes`` measures a workspace (allocated blocks, links not
  followed, a hard-linked inode counted once). ``Sandbox.run`` watches it while
  a program runs and stops the program once the workspace grows past its quota
  (``Limits.workspace_mb``); the overshoot is what the program writes in one
  polling interval, each file also capped by RLIMIT_FSIZE. The file tools
  check the same quota before each write (``tools.journal``). The store, the
  journal and the bot's logs live outside every workspace, so a full
  workspace never stops them.
- Memory: ``MemoryBudget``. Where the machine has a writable memory cgroup
  (v2, or v1's ``memory`` hierarchy), every sandboxed process joins one
  ``nightshift-sandbox`` group whose limit is the total: the kernel enforces
  it, and only sandboxed processes are killed when it is reached. Elsewhere
  a budget of runs: each run reserves its address-space limit
  (``Limits.address_space_mb``) and waits, up to ``wait_s``, while the total
  is taken. That bounds the main processes, not their children (each child
  has its own RLIMIT_AS), which only the cgroup does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import stat
import time
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

logger = logging.getLogger("nightshift.sandbox")

_MIB = 1 << 20
CGROUP_NAME = "nightshift-sandbox"
_GROUPS = itertools.count(1)
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def usage_bytes(root: Path) -> int:
    """Disk space the tree under ``root`` takes (allocated blocks; links not followed).

    Walked by folder descriptor (``os.fwalk``, which opens each folder relative to its
    parent and checks it is the folder it listed), so a job that swaps a folder for a
    link mid-walk cannot send the walk through the host's tree."""
    total, seen = 0, set()
    try:
        walk = os.fwalk(root, follow_symlinks=False, onerror=lambda exc: None)
        for _, dirs, files, dir_fd in walk:
            for name in dirs + files:
                try:
                    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
                if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    except OSError:
        pass  # the root itself went away: nothing is used
    return total


def over_quota_message(used: int, quota: int) -> str:
    return (f"the workspace is full: it uses {used / _MIB:.1f} MiB of its {quota / _MIB:.0f} MiB "
            "quota (sandbox.workspace_quota_mb). Delete files you no longer need, then try again")


def _own_cgroup(controller: str | None) -> str | None:
    """This process's cgroup path in the v1 ``controller`` hierarchy, or in v2 (None)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (controller is None and controllers == "") or controller in controllers.split(","):
            return path
    return None


def setup_cgroup(total_mb: int, root: Path = _CGROUP_ROOT) -> Path | None:
    """Make a memory cgroup for this budget with ``total_mb`` as its limit; its
    ``cgroup.procs`` file, or None where no writable memory cgroup exists.

    Each budget has its own group (named by pid and a count), so two bots on one machine,
    or a bot and the tests, never rewrite each other's limit; and a group is never lowered
    below what earlier programs left charged to it (the kernel refuses that)."""
    name = f"{CGROUP_NAME}-{os.getpid()}-{next(_GROUPS)}"
    candidates = []
    if (root / "cgroup.controllers").is_file():  # v2
        own = _own_cgroup(None)
        if own is not None:
            candidates.append((root / own.lstrip("/"), "memory.max", True))
    own = _own_cgroup("memory")
    if own is not None and (root / "memory").is_dir():  # v1
        candidates.append((root / "memory" / own.lstrip("/"), "memory.limit_in_bytes", False))
    for parent, limit_file, v2 in candidates:
        _remove_stale_groups(parent)
        group = parent / name
        try:
            if v2 and "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                (parent / "cgroup.subtree_control").write_text("+memory")
            group.mkdir(exist_ok=True)
            (group / limit_file).write_text(str(total_mb * _MIB))
            return group / "cgroup.procs"
        except OSError as exc:
            logger.info("no memory cgroup at %s (%s)", group, exc)
    return None


def _remove_stale_groups(parent: Path) -> None:
    """Remove the empty groups of bots that have exited."""
    for group in parent.glob(f"{CGROUP_NAME}-*-*"):
        try:
            pid = int(group.name.rsplit("-", 2)[1])
        except ValueError:
            continue
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            remove_group(group)


def remove_group(group: Path) -> None:
    try:
        group.rmdir()  # only an empty group goes; its charge goes with it
    except OSError:
        pass


class MemoryBudget:
    """The memory of all sandboxed runs together; see the module docstring."""

    def __init__(self, total_mb: int, *, use_cgroup: bool = True, wait_s: float = 30.0) -> None:
        self.total_mb = total_mb
        self.wait_s = wait_s
        self.cgroup_procs = setup_cgroup(total_mb) if use_cgroup else None
        self.reserved_mb = 0
        if self.cgroup_procs is not None:
            weakref.finalize(self, remove_group, self.cgroup_procs.parent)

    @property
    def kind(self) -> str:
        return "cgroup" if self.cgroup_procs else "budget"

    @contextlib.asynccontextmanager
    async def reserve(self, mb: int) -> AsyncIterator[bool]:
        """Hold ``mb`` of the budget for one run; yields False when it stayed taken for
        ``wait_s`` (the run must not start). With a cgroup the kernel keeps the total."""
        if self.cgroup_procs is not None:
            yield True
            return
        mb = min(mb, self.total_mb)  # one run alone always fits
        deadline = time.monotonic() + self.wait_s
        while self.reserved_mb + mb > self.total_mb:
            if time.monotonic() >= deadline:
                yield False
                return
            await asyncio.sleep(0.05)
        self.reserved_mb += mb
        try:
            yield True
        finally:
            self.reserved_mb -= mb

    def busy_message(self) -> str:
        return (f"not started: the {self.total_mb} MiB that sandboxed programs may use together "
                f"(sandbox.total_memory_mb) stayed in use by other programs for {self.wait_s:g} s; "
                "try again later, or stop a background job (job_stop)")
