"""/forget erases every copy of an episode's text, or names what it leaves (issue 40,
part 4): a planted string is searched for in the store (through SQL and in the file's
bytes), in every file of the data dir, and in chromadb's notes and value memory through
its API, and is found only where the README says it stays."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bot.channels import ChannelSpaces
from bot.labelling import forget
from core.storage.copies import holding_value_memory, purge_value_memory
from core.storage.embedder import MiniLMEmbedder
from core.storage.store import Prefix, Step, Store
from tests.test_forget import found_in_store, in_files
from tests.test_forget_night import write
from tools import Services
from tools.notes import NoteStore
from trainer.judge import SubTask
from trainer.value import ValueMemory

PLANTED = "PLANTED-copies-b40c2d"
DIGEST, KEPT = "a" * 64, "b" * 64  # cached images: one only it viewed, one viewed elsewhere


@pytest.fixture(scope="module")
def embedder():
    return MiniLMEmbedder()


def memories(data_dir: Path, embedder) -> ValueMemory:
    return ValueMemory(data_dir / "value-memory", embedder)


async def plant(store: Store, spaces: ChannelSpaces, embedder) -> int:
    """An episode that leaves its text everywhere a copy can go; its id."""
    data, ctx = spaces.data_dir, spaces.context("general")
    (ctx.workspace.root / "uploads").mkdir(parents=True)
    (ctx.workspace.root / "uploads" / "plan.txt").write_text(PLANTED)  # an attachment
    note = ctx.services.notes.add("general", f"the plan is {PLANTED}", title="plan")
    images = data / "images"
    images.mkdir()
    for digest in (DIGEST, KEPT):
        (images / f"{digest}.png").write_bytes(PLANTED.encode())
    episode, _ = await store.start_turn("general", "m", [
        Step(role="system", content="sys"),
        Step(role="user",
             content=f"keep this safe: {PLANTED}\n[attached: uploads/plan.txt (21 B)]")])
    arguments = f'{{"title": "plan", "text": "the plan is {PLANTED}"}}'
    call = {"id": "1", "type": "function",
            "function": {"name": "note_create", "arguments": arguments}}
    await store.add_step(episode, Step(role="assistant", content="", tool_calls=[call]))
    await store.add_step(episode, Step(role="tool", name="note_create",
                                       content=f"saved note {note} (for this channel); ..."))
    for digest in (DIGEST, KEPT):
        await store.add_step(episode, Step(role="tool", name="view_image", content="an image",
                                           meta={"ok": True, "image": {
                                               "sha256": digest,
                                               "cache_path": str(images / f"{digest}.png")}}))
    with ctx.journal.change("write_file plan-copy.txt") as tx:  # a file its turn wrote
        tx.write(ctx.workspace.root / "plan-copy.txt", PLANTED.encode())
    await store.add_step(episode, Step(role="assistant", content=f"Saved {PLANTED}."))
    await store.end_episode(episode, "complete")
    # A later turn that read it (its prefix and its compaction summary), one that viewed
    # the other image, and what two past nights derived from it.
    later, _ = await store.start_turn("general", "m", [Step(role="user", content="next")],
                                      prefix=Prefix([{"role": "user", "content": PLANTED}],
                                                    None, (episode,)))
    await store.add_step(later, Step(role="tool", name="view_image", content="again",
                                     meta={"image": {"sha256": KEPT}}))
    await store.add_event("general", later, "compaction", {"summary": PLANTED,
                                                           "sources": [episode, later]})
    await store.end_episode(later, "complete")
    await store.put_record(1, "judgment", "general:0", {"subtasks": [{"description": PLANTED}],
                                                         "episodes": [episode, later]})
    await store.save_advantages(1, [{"episode_id": episode, "step_id": 3, "advantage": 0.5}])
    await store.add_release("night-0001", str(data), {"night": 1}, "candidate")
    await store.set_release_state(1, "live")
    write(data / "nights" / "night-0001" / "train.jsonl", [
        {"kind": "episode", "episode_id": episode, "sources": [episode],
         "messages": [{"role": "user", "content": PLANTED}]},
        {"kind": "episode", "episode_id": later, "sources": [episode, later],
         "messages": [{"role": "user", "content": PLANTED}]},
        {"kind": "episode", "episode_id": 99, "messages": [  # written before rows had sources
            {"role": "user", "content": f"keep this safe: {PLANTED}\n"
                                        "[attached: uploads/plan.txt (21 B)]"}]},
        {"kind": "episode", "episode_id": 98, "sources": [98],
         "messages": [{"role": "user", "content": "unrelated"}]}])
    memory = memories(data, embedder)
    memory.add_batch([SubTask("general", 0, 3, f"remember {PLANTED}", 1.0, 1,
                              key="general:0:3", episodes=[episode]),
                      SubTask("other", 0, 1, "unrelated task", 1.0, 1, key="other:0:1",
                              episodes=[98])], night_id=1, now=time.time())
    memory.collection.upsert(ids=["0:old"], documents=[f"older {PLANTED}"], metadatas=[
        {"reward": 1.0, "length": 1, "date": 0.0, "channel": "general", "night": 0}])
    return episode


async def test_every_copy_is_erased_or_named(tmp_path, embedder):
    notes = NoteStore(tmp_path / "notes", embedder)
    spaces = ChannelSpaces(tmp_path, {}, Services(notes=notes, image_cache=tmp_path / "images"),
                           embedder=embedder)
    store = await Store.open(tmp_path / "nightshift.db")
    try:
        episode = await plant(store, spaces, embedder)
        reply = await forget(store, episode, user_id=0, admin=True, spaces=spaces)
        assert reply.startswith(f"Episode #{episode} is forgotten")
        for said in ("1 later summaries", "1 night ledger records", "1 notes it wrote",
                     "1 cached images", "3 rows of 1 night datasets", "2 value memories",
                     "uploads/plan.txt", "plan-copy.txt", "release #1 (live)"):
            assert said in reply, reply
        assert found_in_store(tmp_path / "nightshift.db") == []
        assert not (tmp_path / "images" / f"{DIGEST}.png").exists()
        assert (tmp_path / "images" / f"{KEPT}.png").exists()  # the later turn viewed it too
    finally:
        await store.close()
    # chromadb, through its API: no note and no memory holds it; the other memory stays.
    assert PLANTED not in str(notes.list("general", limit=100))
    left = memories(tmp_path, embedder).collection.get(include=["documents"])
    assert left["documents"] == ["unrelated task"]
    # Every file of the data dir, byte by byte: only the workspace's files, their undo
    # copies, the image another episode viewed, and chromadb's own files (its write log
    # keeps a deleted document's bytes until it compacts) still hold it: the README says so.
    allowed = ("workspaces/", "channels/", f"images/{KEPT}.png", "notes/", "value-memory/")
    found = [str(Path(p).relative_to(tmp_path)) for p in in_files(tmp_path, PLANTED)]
    assert found and all(p.startswith(allowed) for p in found), found


async def test_the_value_memory_is_purged_by_whoever_holds_it(tmp_path, embedder):
    memory = memories(tmp_path, embedder)
    memory.add_batch([SubTask("c", 0, 1, PLANTED, 1.0, 1, key="c:0:1", episodes=[5])], 1, 0.0)
    with holding_value_memory(tmp_path):  # a night holds it: /forget leaves it to the night
        assert purge_value_memory(tmp_path, {5: "c"}) is None
    assert memory.count() == 1
    assert purge_value_memory(tmp_path, {5: "c"}) == 1
    assert memory.count() == 0
