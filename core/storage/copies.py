"""Copies of episodes' text outside the store: the nights' datasets and the value memory.

A night writes its training rows to ``nights/night-NNNN/train.jsonl`` under the data dir,
and, once it has trained, its judged sub-task descriptions to the value memory (a chromadb
collection under ``value-memory/``). Both are derived from episodes that may later be
forgotten, so each says which episodes it came from:

- a row's ``sources``: the episodes whose text its messages hold (its own episode, the
  history its prompt prefix carried, the sub-task a value prediction describes and the
  memories it was shown). Rows written before ``sources`` existed are judged by their
  ``episode_id`` and by whether they hold any of the forgotten text verbatim;
- a memory's ``episodes`` metadata (``",3,17,"``: chromadb metadata is scalar). Memories
  written before that are judged by channel: every memory of a forgotten episode's
  channel without the list is deleted, since it cannot say what it read.

``/forget`` (``bot.forgetting``) and the night (``trainer.sleep``) both call these, so a
file is rewritten under a lock (two rewriters must not put back each other's rows), and
the value memory is purged only by whoever holds its lock: chromadb does not share a
collection between processes, and a night keeps its memory open (and locked) while it
runs, then purges it itself before it lets go.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

VALUE_MEMORY = "value-memory"  # trainer.value.ValueMemory's collection and folder
_LOCK = ".lock"
_MIN_TEXT = 24  # shorter texts ("ok", "thanks") match rows they never came from


def row_sources(row: dict) -> set[int]:
    """The episodes whose text a training row holds (its ``sources``, else its own)."""
    found = row.get("sources")
    if found is None:
        found = [] if row.get("episode_id") is None else [row["episode_id"]]
    return {int(i) for i in found}


def carries(row: dict, forgotten: set[int], texts: tuple[str, ...] = ()) -> bool:
    """Whether a row holds text of a forgotten episode; ``texts`` (the forgotten steps'
    contents) are looked for verbatim only in rows from before ``sources`` existed."""
    if row_sources(row) & forgotten:
        return True
    if "sources" in row or not texts:
        return False
    body = "\n".join(_text(m) for m in row.get("messages", []))
    return any(text in body for text in texts if len(text) >= _MIN_TEXT)


def _text(message: dict) -> str:
    """A message's words as written (a JSON dump would escape a newline in them)."""
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    calls = message.get("tool_calls")
    return str(content or "") + (json.dumps(calls, ensure_ascii=False) if calls else "")


def erased_texts(contents: list[str]) -> tuple[str, ...]:
    """The contents worth looking for in older rows (long enough to be the episode's)."""
    return tuple(sorted({c for c in contents if c and len(c) >= _MIN_TEXT}))


@contextmanager
def _locked(path: Path, blocking: bool = True) -> Iterator[bool]:
    """An exclusive lock on ``path`` (created); yields False when ``blocking`` is off and
    another holder has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing lets the lock go


def scrub_dataset(path: Path, forgotten: set[int], texts: tuple[str, ...] = ()) -> int:
    """Rewrite a night's JSONL without the rows that carry forgotten text; how many went.
    The rewrite is a temp file and ``os.replace``, under the night folder's lock."""
    if not path.is_file():
        return 0
    with _locked(path.parent / _LOCK):
        lines = path.read_text(encoding="utf-8").splitlines()
        kept = [line for line in lines if line.strip()
                and not carries(json.loads(line), forgotten, texts)]
        dropped = sum(1 for line in lines if line.strip()) - len(kept)
        if dropped:
            partial = path.with_name(f"{path.name}.{os.getpid()}.scrub")
            partial.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            os.replace(partial, path)
    return dropped


def scrub_nights(nights_dir: Path, forgotten: set[int], texts: tuple[str, ...] = ()
                 ) -> dict[Path, int]:
    """Every night's datasets without the forgotten rows: {file: rows dropped} for those
    that lost any."""
    out = {}
    for path in sorted(nights_dir.glob("night-*/*.jsonl")) if nights_dir.is_dir() else []:
        dropped = scrub_dataset(path, forgotten, texts)
        if dropped:
            out[path] = dropped
    return out


# -- the value memory ----------------------------------------------------------------------

def episodes_meta(episodes: set[int] | list[int]) -> str:
    """A memory's ``episodes`` metadata: ``",3,17,"`` (chromadb metadata is scalar)."""
    return "," + ",".join(str(i) for i in sorted(set(episodes))) + ","


def meta_episodes(meta: dict | None) -> set[int] | None:
    """The episodes a memory's metadata names, or None for a memory from before the list."""
    text = (meta or {}).get("episodes")
    if not isinstance(text, str):
        return None
    return {int(part) for part in text.split(",") if part.strip().isdigit()}


def stale_memories(collection: Any, forgotten: dict[int, str]) -> list[str]:
    """The ids of memories made from forgotten episodes (``forgotten``: id -> channel)."""
    if not forgotten:
        return []
    found = collection.get(include=["metadatas"])
    channels = set(forgotten.values())
    stale = []
    for memory_id, meta in zip(found["ids"], found["metadatas"]):
        episodes = meta_episodes(meta)
        if episodes is None:
            if (meta or {}).get("channel") in channels:
                stale.append(memory_id)
        elif episodes & set(forgotten):
            stale.append(memory_id)
    return stale


@contextmanager
def holding_value_memory(data_dir: Path, blocking: bool = True) -> Iterator[bool]:
    """The value memory's lock (see the module docstring): a night holds it while its
    memory is open; ``/forget`` asks without waiting."""
    with _locked(data_dir / f"{VALUE_MEMORY}{_LOCK}", blocking) as held:
        yield held


def purge_value_memory(data_dir: Path, forgotten: dict[int, str]) -> int | None:
    """Delete the value memory's memories of forgotten episodes, if no night holds it:
    how many went, or None when a night does (it purges them itself before it ends)."""
    folder = data_dir / VALUE_MEMORY
    with holding_value_memory(data_dir, blocking=False) as held:
        if not held:
            return None
        if not folder.is_dir():
            return 0
        import chromadb  # heavy; loaded when there is a memory to purge

        client = chromadb.PersistentClient(path=str(folder))
        try:
            collection = client.get_collection(VALUE_MEMORY)
        except Exception:  # noqa: BLE001 - chromadb's "does not exist" has no stable type
            return 0
        stale = stale_memories(collection, forgotten)
        if stale:
            collection.delete(ids=stale)
        return len(stale)
