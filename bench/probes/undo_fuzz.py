"""Undo/redo fuzz: random file edits, undo, redo and outside writes, each checked against
a model of the expected state, through the real tools and the channel's journal.

The model keeps two stacks of (before, after) snapshots of the workspace and the system
section. A call that changes the state pushes one entry and clears redo (the journal
keeps what a tool changed before failing halfway, so it stays undoable); one that changes
nothing leaves both stacks alone; undo must restore the ``before`` of the newest entry, redo its ``after``;
with nothing to undo or redo they must refuse. Two outside writes test "undo only what
you did": one to a file the journal never touched (undo must proceed and keep it), one
to a file the newest entry touched (undo must refuse and change nothing).
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

from bench.probes import Tally
from sandbox.paths import Workspace
from tools import ToolContext, default_registry
from tools.system import read_sys_section

PATHS = ["a.txt", "b.txt", "d", "d/c.txt", "d/e", "d/e/f.txt", "g"]
OUTSIDE = "outside.txt"  # written behind the journal's back; never touched by the tools
REGISTRY = default_registry()


def snapshot(ctx: ToolContext) -> dict[str, bytes | str]:
    root = ctx.workspace.root
    state: dict[str, bytes | str] = {"@sys": read_sys_section(ctx.state_dir)}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            state[os.path.relpath(os.path.join(folder, name), root)] = "DIR"
        for name in files:
            rel = os.path.relpath(os.path.join(folder, name), root)
            if rel != OUTSIDE:
                state[rel] = Path(folder, name).read_bytes()
    return state


def random_op(rng: random.Random) -> tuple[str, dict]:
    path, text = rng.choice(PATHS), "".join(rng.choice("ab\n") for _ in range(rng.randint(0, 12)))
    line, end = rng.randint(0, 5), rng.randint(0, 5)
    return rng.choice([
        ("write_file", {"path": path, "content": text}),
        ("edit_file", {"path": path, "mode": "replace_lines", "start": line, "end": end, "text": text}),
        ("edit_file", {"path": path, "mode": "insert", "after": line, "text": text}),
        ("edit_file", {"path": path, "mode": "delete_lines", "start": line, "end": end}),
        ("edit_file", {"path": path, "mode": "replace_text", "old": text[:2], "new": text[2:]}),
        ("make_dir", {"path": path}), ("delete", {"path": path}),
        ("update_sys", {"action": "append", "text": text}),
        ("update_sys", {"action": "delete", "line": line}),
        ("undo", {}), ("undo", {}), ("redo", {}),
    ])


class Model:
    def __init__(self) -> None:
        self.done: list[tuple[dict, dict]] = []
        self.undone: list[tuple[dict, dict]] = []

    def expect(self, name: str, ok: bool, before: dict, after: dict) -> tuple[bool, str]:
        """Whether the tool's outcome matches the model, and update the model."""
        if name == "undo":
            if not self.done:
                return not ok and after == before, "undo with nothing to undo"
            entry = self.done.pop()
            self.undone.append(entry)
            return ok and after == entry[0], "undo restores the entry's before"
        if name == "redo":
            if not self.undone:
                return not ok and after == before, "redo with nothing to redo"
            entry = self.undone.pop()
            self.done.append(entry)
            return ok and after == entry[1], "redo restores the entry's after"
        # The journal records what changed, even when the tool failed halfway (that part
        # stays undoable), and a call that changed nothing leaves undo and redo alone.
        if after != before:
            self.done.append((before, after))
            self.undone.clear()
        return True, "a change is recorded" if after != before else "no change, nothing recorded"


async def _outside_writes(tally: Tally, ctx: ToolContext, model: Model, rng: random.Random) -> None:
    root = ctx.workspace.root
    marker = f"outside {rng.random()}\n"
    (root / OUTSIDE).write_text(marker)  # untouched by the journal: undo proceeds, keeps it
    if model.done:
        before = snapshot(ctx)
        result = await REGISTRY.call("undo", {}, ctx)
        held, why = model.expect("undo", result.ok, before, snapshot(ctx))
        tally.check(f"undo beside an outside file: {why}", held and (root / OUTSIDE).read_text()
                    == marker, result.output[:200])
    (root / OUTSIDE).unlink()
    # A file the newest entry wrote, changed outside: undo must refuse and change nothing.
    path = rng.choice(["a.txt", "b.txt"])
    journaled = f"journaled {rng.random()}\n"  # never a no-op, which would record nothing
    before_write = snapshot(ctx)
    write = await REGISTRY.call("write_file", {"path": path, "content": journaled}, ctx)
    if not write.ok:
        return
    model.expect("write_file", True, before_write, snapshot(ctx))
    (root / path).write_text("changed by a python job\n")
    before = snapshot(ctx)
    result = await REGISTRY.call("undo", {}, ctx)
    tally.check("undo refuses a file changed outside the journal, changing nothing",
                not result.ok and snapshot(ctx) == before, result.output[:200])
    (root / path).write_text(journaled)  # as the journal left it: undo may go on


async def run(tally: Tally, work: Path, quick: bool) -> None:
    sequences, length = (6, 40) if quick else (40, 60)
    for seed in range(sequences):
        rng = random.Random(seed)
        base = Path(tempfile.mkdtemp(dir=work))
        ctx = ToolContext.open("fuzz", Workspace(base / "ws"), base / "state")
        model = Model()
        for step in range(length):
            name, arguments = random_op(rng)
            before = snapshot(ctx)
            result = await REGISTRY.call(name, arguments, ctx)
            held, why = model.expect(name, result.ok, before, snapshot(ctx))
            tally.check(f"seed {seed} step {step} {name}: {why}", held,
                        f"{arguments} -> ok={result.ok}: {result.output[:160]!r}")
            if not held:
                break  # the model no longer knows the state; the rest would only echo this
            if rng.random() < 0.05:
                await _outside_writes(tally, ctx, model, rng)
    tally.notes.append(f"{sequences} random sequences of {length} operations")
