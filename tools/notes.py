"""Notes: short texts the agent keeps and finds again by meaning.

A ``NoteStore`` is one chromadb ``PersistentClient`` on disk (outside every
workspace) with one collection per channel plus one ``shared`` collection
that every channel reads. Embeddings always come from the injected embedder
(the bot's offline MiniLM): chromadb's default embedder would download a
model from the internet. A note is embedded as its title and text together,
so a search matches either; the text alone is stored as the document.

Shared notes are opt-in per channel: only channels listed in
``ctx.services.shared_notes_channels`` (``agent.shared_notes_channels``)
read, write or delete them; every other channel, DMs included, sees only its
own notes, so nothing leaks between channels by default. Shared notes
remember which channel wrote them: only that channel may delete one, so one
channel's agent cannot wipe what others rely on. ``clean`` (the admin's
``/notes-wipe CONFIRM``) removes a channel's notes, shared ones it wrote
included. ``stats`` and ``duplicate_groups`` find near-duplicates by
embedding similarity, for the health tool and the routine cleaning.

chromadb calls block; the registry runs these tools in a thread.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from pathlib import Path
from typing import Any

from tools import ToolContext, ToolError, tool

SHARED = "shared"
MAX_TEXT_CHARS = 4000
MAX_TITLE_CHARS = 200
MAX_K = 20
# Notes one channel keeps (and the shared collection holds) at most: they lie outside every
# workspace quota, so without a cap one channel could fill the disk a few KiB at a time.
MAX_NOTES = 2000
# What a note takes on disk beyond its text: its embedding, metadata and index entries
# (500 notes of 200 characters grew the folder by 3.5 KiB each, text included; rounded up).
NOTE_OVERHEAD_BYTES = 8192
LIST_LIMIT = 50
SEARCH_SNIPPET_CHARS = 1000


class NoteStore:
    """Per-channel and shared note collections in one chromadb directory."""

    duplicate_similarity = 0.9  # notes this cosine-similar are duplicates (config sets it)

    def __init__(self, path: Path, embedder: Any) -> None:
        import chromadb  # heavy; only loaded when notes are enabled

        if embedder is None:
            raise ValueError("NoteStore needs an embedder; chromadb's default one downloads a model")
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._embedder = embedder
        self._client = chromadb.PersistentClient(path=str(self.path))

    # --- writing ---

    def add(self, channel: str, text: str, title: str = "", shared: bool = False) -> str:
        """Store a note; returns its id."""
        note_id = uuid.uuid4().hex[:12]
        meta = {"title": title, "channel": channel, "created": time.time()}
        embedding = self._embedder([f"{title}\n{text}" if title else text])
        self._collection(channel, shared).add(ids=[note_id], documents=[text],
                                              metadatas=[meta], embeddings=embedding)
        return note_id

    def delete(self, channel: str, note_id: str, include_shared: bool = True) -> bool:
        """Delete one of the channel's notes, or a shared note it wrote.

        Returns False when no such note is visible to the channel; raises
        ValueError for a shared note another channel wrote.
        """
        own = self._collection(channel)
        if own.get(ids=[note_id], include=[])["ids"]:
            own.delete(ids=[note_id])
            return True
        if not include_shared:
            return False
        shared = self._collection(channel, shared=True)
        found = shared.get(ids=[note_id], include=["metadatas"])
        if not found["ids"]:
            return False
        author = (found["metadatas"][0] or {}).get("channel")
        if author != channel:
            raise ValueError(f"note {note_id} is a shared note written by another channel; "
                             "only that channel can delete it")
        shared.delete(ids=[note_id])
        return True

    def clean(self, channel: str) -> int:
        """Delete every note of the channel, shared ones it wrote included; returns how many."""
        own = self._collection(channel)
        removed = own.count()
        self._client.delete_collection(own.name)
        shared = self._collection(channel, shared=True)
        mine = shared.get(where={"channel": channel}, include=[])["ids"]
        if mine:
            shared.delete(ids=mine)
        return removed + len(mine)

    # --- reading ---

    def search(self, channel: str, query: str, k: int = 5, include_shared: bool = True) -> list[dict]:
        """The k notes nearest to ``query`` (cosine distance, smallest first)."""
        embedding = self._embedder([query])
        hits: list[dict] = []
        for scope, collection in self._scopes(channel, include_shared):
            count = collection.count()
            if not count:
                continue
            found = collection.query(query_embeddings=embedding, n_results=min(k, count),
                                     include=["documents", "metadatas", "distances"])
            for note_id, text, meta, distance in zip(found["ids"][0], found["documents"][0],
                                                     found["metadatas"][0], found["distances"][0]):
                hits.append(_note(note_id, text, meta, scope, distance))
        hits.sort(key=lambda h: h["distance"])
        return hits[:k]

    def list(self, channel: str, include_shared: bool = True, limit: int = LIST_LIMIT) -> list[dict]:
        """The channel's notes (and shared ones), newest first, at most ``limit``."""
        notes: list[dict] = []
        for scope, collection in self._scopes(channel, include_shared):
            found = collection.get(include=["documents", "metadatas"])
            for note_id, text, meta in zip(found["ids"], found["documents"], found["metadatas"]):
                notes.append(_note(note_id, text, meta, scope))
        notes.sort(key=lambda n: n["created"], reverse=True)
        return notes[:limit]

    def count(self, channel: str, include_shared: bool = True) -> int:
        return sum(c.count() for _, c in self._scopes(channel, include_shared))

    def size(self, channel: str, shared: bool = False) -> int:
        """How many notes the channel's own collection (or the shared one) holds."""
        return self._collection(channel, shared).count()

    # --- hygiene ---

    def duplicate_groups(self, channel: str) -> list[list[str]]:
        """Groups of the channel's own notes at least ``duplicate_similarity`` alike (ids)."""
        found = self._collection(channel).get(include=["embeddings"])
        return _similar_groups(found["ids"], found["embeddings"], self.duplicate_similarity)

    def stats(self) -> list[dict]:
        """Per collection: its channel ("shared" for the shared one), notes and duplicates,
        a duplicate being a note beyond the first of its near-duplicate group."""
        out = []
        for collection in self._client.list_collections():
            found = collection.get(include=["embeddings", "metadatas"])
            if collection.name == SHARED:
                channel = SHARED
            else:
                metas = [m for m in found["metadatas"] if m] or [{}]
                channel = metas[0].get("channel", collection.name)
            groups = _similar_groups(found["ids"], found["embeddings"], self.duplicate_similarity)
            out.append({"channel": channel, "notes": len(found["ids"]),
                        "duplicates": sum(len(g) - 1 for g in groups)})
        return sorted(out, key=lambda s: s["channel"])

    # --- collections ---

    def _scopes(self, channel: str, include_shared: bool) -> list[tuple[str, Any]]:
        scopes = [("channel", self._collection(channel))]
        if include_shared:
            scopes.append((SHARED, self._collection(channel, shared=True)))
        return scopes

    def _collection(self, channel: str, shared: bool = False) -> Any:
        # The embedder's default space is cosine, so the collection's is too.
        name = SHARED if shared else collection_name(channel)
        return self._client.get_or_create_collection(name, embedding_function=self._embedder)


def collection_name(channel: str) -> str:
    """A valid chromadb name for the channel: readable slug plus a hash of the exact id.

    chromadb wants 3-512 characters of [a-zA-Z0-9._-] starting and ending
    alphanumeric. The ``ch-`` prefix keeps a channel called "shared" apart
    from the shared collection; the hash keeps channels apart whose slugs
    are equal (``a/b`` and ``a-b``) or cut short.
    """
    slug = re.sub(r"[^A-Za-z0-9]+", "-", channel).strip("-")[:40].strip("-") or "channel"
    digest = hashlib.sha256(channel.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"ch-{slug}-{digest}"


MAX_DUPLICATE_SCAN = 2000  # notes past this in one channel are not compared pairwise


def _similar_groups(ids: list[str], embeddings: Any, threshold: float) -> list[list[str]]:
    """Groups (of 2+) of ids linked by cosine similarity >= threshold, in first-seen order.
    Compared in blocks of rows, never as one N x N matrix, and not at all past
    ``MAX_DUPLICATE_SCAN`` notes (no groups then: the caller says so)."""
    import numpy as np

    if len(ids) < 2 or len(ids) > MAX_DUPLICATE_SCAN:
        return []
    vectors = np.asarray(embeddings, dtype=np.float32)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    near: list[list[int]] = []
    for start in range(0, len(ids), 256):
        block = vectors[start:start + 256] @ vectors.T >= threshold  # (<=256, N)
        near.extend([int(k) for k in np.flatnonzero(row)] for row in block)
    group_of: dict[int, int] = {}
    groups: list[list[int]] = []
    for i in range(len(ids)):
        if i in group_of:
            continue
        group, todo = [], [i]
        while todo:  # everything reachable through similar pairs
            j = todo.pop()
            if j in group_of:
                continue
            group_of[j] = len(groups)
            group.append(j)
            todo.extend(k for k in near[j] if k not in group_of)
        groups.append(sorted(group))
    return [[ids[j] for j in g] for g in groups if len(g) > 1]


def _note(note_id: str, text: str | None, meta: dict | None, scope: str,
          distance: float | None = None) -> dict:
    meta = meta or {}
    note = {"id": note_id, "title": meta.get("title", ""), "text": text or "", "scope": scope,
            "created": float(meta.get("created", 0.0))}
    if distance is not None:
        note["distance"] = float(distance)
    return note


# --- tools ---


def _store(ctx: ToolContext) -> NoteStore:
    store = ctx.services.notes
    if store is None:
        raise ToolError("notes are not enabled in this bot; keep notes in files instead "
                        "(write_file), or in your system-prompt section (update_sys)")
    return store


def _shared_ok(ctx: ToolContext) -> bool:
    """Whether this channel opted in to the notes shared between channels."""
    return ctx.channel in ctx.services.shared_notes_channels


def _when(created: float) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(created)) if created else "?"


def _headline(note: dict) -> str:
    first = note["text"].strip().splitlines()[0] if note["text"].strip() else ""
    title = note["title"] or (first[:60] + ("..." if len(first) > 60 else ""))
    return f"[{note['id']}] ({note['scope']}, {_when(note['created'])}) {title}"


@tool
def note_create(ctx: ToolContext, title: str, text: str, shared: bool = False) -> str:
    """Save a note you can find again later by meaning with note_search, in this and later
    conversations. Keep one fact, decision or how-to per note.

    Args:
        title: A short title saying what the note is about.
        text: The note itself, up to 4000 characters.
        shared: true makes the note visible to the channels that share notes (if this one does).
    """
    text, title = text.strip(), title.strip()
    if not text:
        raise ToolError("text is empty; a note needs some text")
    if len(text) > MAX_TEXT_CHARS:
        raise ToolError(f"text has {len(text)} characters; the limit is {MAX_TEXT_CHARS}. "
                        "Split it into several notes, or keep long texts in a file")
    if len(title) > MAX_TITLE_CHARS:
        raise ToolError(f"title has {len(title)} characters; keep it under {MAX_TITLE_CHARS}")
    if shared and not _shared_ok(ctx):
        raise ToolError("shared notes are off in this channel (an admin can list it in "
                        "agent.shared_notes_channels); save it with shared=false instead")
    store = _store(ctx)
    if store.size(ctx.channel, shared) >= MAX_NOTES:
        where = "the shared notes hold" if shared else "this channel has"
        raise ToolError(f"{where} {MAX_NOTES} notes, the most kept; delete or merge old ones "
                        "first (note_list, note_delete)")
    if ctx.services.disk is not None:  # the notes' folder counts in the data folder's budget
        ctx.services.disk.claim(store.path, NOTE_OVERHEAD_BYTES + len(f"{title}{text}".encode()))
    note_id = store.add(ctx.channel, text, title=title, shared=shared)
    where = "shared with every channel" if shared else "for this channel"
    return f"saved note {note_id} ({where}); note_search finds it, note_delete('{note_id}') removes it"


@tool
def note_list(ctx: ToolContext) -> str:
    """List your notes (this channel's, and the shared ones if this channel uses them), newest
    first, by id and title."""
    store = _store(ctx)
    notes = store.list(ctx.channel, include_shared=_shared_ok(ctx))
    if not notes:
        return "there are no notes yet; note_create saves one"
    total = store.count(ctx.channel, include_shared=_shared_ok(ctx))
    lines = [_headline(n) for n in notes]
    more = f"\n[... {total - len(notes)} older notes not shown; note_search finds them]" \
        if total > len(notes) else ""
    return f"{total} notes:\n" + "\n".join(lines) + more


@tool
def note_search(ctx: ToolContext, query: str, k: int = 5) -> str:
    """Find the notes closest in meaning to a query, with their full text.

    Args:
        query: What you are looking for, in a few words or a sentence.
        k: How many notes to return, 1 to 20.
    """
    if not query.strip():
        raise ToolError("query is empty; say what you are looking for")
    if not 1 <= k <= MAX_K:
        raise ToolError(f"k must be between 1 and {MAX_K}, got {k}")
    hits = _store(ctx).search(ctx.channel, query.strip(), k=k, include_shared=_shared_ok(ctx))
    if not hits:
        return "there are no notes yet; note_create saves one"
    out = []
    for hit in hits:
        text = hit["text"]
        if len(text) > SEARCH_SNIPPET_CHARS:
            text = text[:SEARCH_SNIPPET_CHARS] + f" [... {len(text) - SEARCH_SNIPPET_CHARS} more characters]"
        out.append(f"{_headline(hit)}  similarity {1 - hit['distance']:.2f}\n{text}")
    return f"{len(hits)} nearest notes:\n\n" + "\n\n".join(out)


@tool
def note_delete(ctx: ToolContext, note_id: str) -> str:
    """Delete a note by its id (note_list and note_search show ids).

    Args:
        note_id: The note's id, e.g. 3f2a9c01b7d4.
    """
    note_id = note_id.strip().strip("[]")
    if not note_id:
        raise ToolError("note_id is empty; note_list shows the ids")
    if not _store(ctx).delete(ctx.channel, note_id, include_shared=_shared_ok(ctx)):
        raise ToolError(f"there is no note {note_id!r}; note_list shows the ids")
    return f"deleted note {note_id}"
