"""Notes: saved per channel or shared, found again by meaning, deleted, cleaned, persistent."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.storage.embedder import MiniLMEmbedder
from sandbox.paths import Workspace
from tools import Registry, ToolContext
import tools.notes
from tools.notes import NoteStore, collection_name

REGISTRY = Registry()
REGISTRY.register_module(tools.notes)


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@pytest.fixture
def store(tmp_path: Path, embedder) -> NoteStore:
    return NoteStore(tmp_path / "notes", embedder)


def context(tmp_path: Path, channel: str, **services) -> ToolContext:
    return ToolContext.open(channel, Workspace(tmp_path / f"ws-{channel}"),
                            tmp_path / f"state-{channel}", **services)


async def ok(ctx: ToolContext, name: str, /, **arguments) -> str:
    result = await REGISTRY.call(name, arguments, ctx)
    assert result.ok, result.output
    return result.output


async def refused(ctx: ToolContext, name: str, /, **arguments) -> str:
    result = await REGISTRY.call(name, arguments, ctx)
    assert not result.ok, result.output
    return result.output


def test_collection_names_are_valid_and_distinct_for_similar_channels():
    names = {collection_name(c) for c in ["a/b", "a-b", "", "x" * 600, "shared", "日本語"]}
    assert len(names) == 6
    assert "shared" not in names
    for name in names:
        assert 3 <= len(name) <= 512
        assert name[0].isalnum() and name[-1].isalnum()
        assert all(ch.isalnum() or ch in "._-" for ch in name)


async def test_search_finds_the_semantically_nearest_note(tmp_path, store):
    ctx = context(tmp_path, "general", notes=store)
    await ok(ctx, "note_create", title="pets", text="Cats are small furry animals that purr.")
    await ok(ctx, "note_create", title="finance", text="The stock market fell three percent today.")
    await ok(ctx, "note_create", title="cooking", text="Boil pasta for nine minutes in salted water.")
    listing = await ok(ctx, "note_list")
    assert "3 notes" in listing and "pets" in listing and "finance" in listing
    found = await ok(ctx, "note_search", query="kitten", k=1)
    assert "Cats are small furry animals" in found
    assert "stock market" not in found
    hits = store.search("general", "kitten", k=3)
    assert hits[0]["title"] == "pets"
    assert hits[0]["distance"] <= hits[1]["distance"] <= hits[2]["distance"]
    assert set(hits[0]) >= {"id", "title", "text", "distance", "scope"}


async def test_shared_notes_are_visible_from_other_channels_but_channel_notes_are_not(tmp_path, store):
    both = {"alpha", "beta"}  # both opted in to shared notes
    alpha = context(tmp_path, "alpha", notes=store, shared_notes_channels=both)
    beta = context(tmp_path, "beta", notes=store, shared_notes_channels=both)
    await ok(alpha, "note_create", title="secret plan", text="Alpha's private plan about dogs.")
    await ok(alpha, "note_create", title="team rule", text="Always run the tests before merging.",
             shared=True)
    seen_by_beta = await ok(beta, "note_list")
    assert "team rule" in seen_by_beta and "(shared" in seen_by_beta
    assert "secret plan" not in seen_by_beta
    found = await ok(beta, "note_search", query="dogs plan", k=5)
    assert "private plan" not in found
    assert "run the tests" in found
    assert store.search("beta", "tests", include_shared=False) == []


async def test_shared_notes_are_opt_in_per_channel(tmp_path, store):
    """Issue 11, part 2: a channel (or a DM) that did not opt in neither reads nor writes them."""
    alpha = context(tmp_path, "alpha", notes=store, shared_notes_channels={"alpha"})
    stranger = context(tmp_path, "dm-42", notes=store, shared_notes_channels={"alpha"})
    await ok(alpha, "note_create", title="team rule", text="Deploy keys are in vault 7.",
             shared=True)
    assert "no notes" in await ok(stranger, "note_list")
    assert "no notes" in await ok(stranger, "note_search", query="deploy keys vault")
    message = await refused(stranger, "note_create", title="x", text="planted", shared=True)
    assert "shared notes are off" in message
    shared_id = store.list("alpha")[0]["id"]
    assert "no note" in await refused(stranger, "note_delete", note_id=shared_id)
    assert "team rule" in await ok(alpha, "note_list")


async def test_delete_removes_a_note_and_unknown_ids_are_refused(tmp_path, store):
    ctx = context(tmp_path, "general", notes=store)
    note_id = store.add("general", "Paris is the capital of France.", title="geo")
    assert "deleted" in await ok(ctx, "note_delete", note_id=note_id)
    assert store.list("general") == []
    message = await refused(ctx, "note_delete", note_id=note_id)
    assert "no note" in message and "note_list" in message


async def test_only_the_writing_channel_may_delete_a_shared_note(tmp_path, store):
    note_id = store.add("alpha", "Deploys happen on Fridays.", title="deploys", shared=True)
    beta = context(tmp_path, "beta", notes=store, shared_notes_channels={"alpha", "beta"})
    message = await refused(beta, "note_delete", note_id=note_id)
    assert "another channel" in message
    assert store.delete("alpha", note_id) is True
    assert store.list("beta") == []


def test_clean_removes_all_of_a_channels_notes_and_nothing_else(store):
    store.add("alpha", "one", title="1")
    store.add("alpha", "two", title="2")
    store.add("alpha", "alpha's shared", shared=True)
    store.add("beta", "beta's own")
    store.add("beta", "beta's shared", shared=True)
    assert store.clean("alpha") == 3
    assert [n["text"] for n in store.list("alpha")] == ["beta's shared"]
    assert {n["text"] for n in store.list("beta")} == {"beta's own", "beta's shared"}
    assert store.clean("alpha") == 0
    store.add("alpha", "after clean")
    assert [n["text"] for n in store.list("alpha", include_shared=False)] == ["after clean"]


def test_notes_persist_across_a_new_store_on_the_same_path(tmp_path, embedder):
    import chromadb.api.client

    first = NoteStore(tmp_path / "notes", embedder)
    note_id = first.add("general", "The office wifi password rotates monthly.", title="wifi")
    shared_id = first.add("general", "Lunch is at noon.", shared=True)
    # Drop chromadb's in-process client cache so the second store really reads the disk.
    chromadb.api.client.SharedSystemClient.clear_system_cache()
    second = NoteStore(tmp_path / "notes", embedder)
    assert {n["id"] for n in second.list("general")} == {note_id, shared_id}
    assert second.search("general", "internet access", k=1)[0]["id"] == note_id


async def test_bad_inputs_are_refused_with_clear_messages(tmp_path, store):
    ctx = context(tmp_path, "general", notes=store)
    assert "text is empty" in await refused(ctx, "note_create", title="t", text="   ")
    assert "limit is 4000" in await refused(ctx, "note_create", title="t", text="x" * 4001)
    assert "between 1 and 20" in await refused(ctx, "note_search", query="x", k=0)
    assert "between 1 and 20" in await refused(ctx, "note_search", query="x", k=21)
    assert "query is empty" in await refused(ctx, "note_search", query=" ")
    assert "note_id is empty" in await refused(ctx, "note_delete", note_id="")
    assert "missing required argument 'text'" in await refused(ctx, "note_create", title="t")
    assert store.list("general") == []


async def test_notes_tools_say_when_notes_are_not_enabled(tmp_path):
    ctx = context(tmp_path, "general")
    for name, arguments in [("note_create", {"title": "t", "text": "x"}), ("note_list", {}),
                            ("note_search", {"query": "x"}), ("note_delete", {"note_id": "abc"})]:
        result = await REGISTRY.call(name, arguments, ctx)
        assert not result.ok and "notes are not enabled" in result.output


async def test_an_empty_store_answers_searches_and_lists_helpfully(tmp_path, store):
    ctx = context(tmp_path, "general", notes=store)
    assert "no notes yet" in await ok(ctx, "note_list")
    assert "no notes yet" in await ok(ctx, "note_search", query="anything")


def test_near_duplicates_are_found_across_comparison_blocks_and_not_past_the_cap():
    import numpy as np

    from tools.notes import MAX_DUPLICATE_SCAN, _similar_groups

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(600, 16))
    vectors[450] = vectors[10]  # a pair 440 rows apart: in different blocks of 256
    groups = _similar_groups([str(i) for i in range(600)], vectors, 0.999)
    assert groups == [["10", "450"]]
    many = np.ones((MAX_DUPLICATE_SCAN + 1, 4))
    assert _similar_groups([str(i) for i in range(len(many))], many, 0.5) == []
