"""/forget against a running turn, a running night, and after a crash (issue 40, part 4).

Each probe plants a unique string in an episode, forgets the episode at a hostile moment,
and then looks for the string everywhere: every table and column of the store (through
SQL), the store's files byte by byte (after the forget's checkpoint), every file of the
data dir, and the notes and the value memory through chromadb's API. It may be found only
where the README's threat model says a forget leaves it: the channel's workspace files and
their undo copies, and chromadb's own files (its write log keeps a deleted document's bytes
until it compacts).

- turn: the forget lands while the episode's own turn runs (during a tool that writes a
  note, during the model's reply), or while the next turn, which read it in its history,
  compacts its context into a summary of it;
- night: a night that collected the episode drops it before training, refuses its release
  when it is forgotten after, /promote refuses such a candidate, the ledger takes no record
  of it, and a memory held by a night is purged when the night lets it go;
- crash: a process is SIGKILLed in the middle of a turn, leaving its episode open; the
  open episode is forgotten.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from pathlib import Path

from bench.probes import Tally
from bot.agent.loop import FORGOTTEN_NOTE, Agent
from bot.channels import ChannelSpaces
from bot.labelling import forget
from core.config import Config
from core.storage.copies import holding_value_memory, purge_value_memory
from core.storage.embedder import MiniLMEmbedder
from core.storage.store import Store
from serving.releases import Releases
from serving.client import Reply
from tests.scripted import ScriptedLLM, call, say
from tools import Services
from tools.notes import NoteStore
from trainer.forgets import ForgottenAfterTraining, drop_forgotten, refuse_if_forgotten
from trainer.judge import SubTask
from trainer.value import ValueMemory

ROOT = Path(__file__).resolve().parents[2]
LEFT = ("workspaces/", "channels/", "notes/", "value-memory/")  # the README's list
TOOLS = [{"type": "function", "function": {"name": n, "description": n, "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}}}}
         for n in ("note_create", "read")]


def found(data_dir: Path, planted: str, notes: NoteStore) -> list[str]:
    """Where ``planted`` still is, outside what the README says a forget leaves."""
    hits = []
    with sqlite3.connect(data_dir / "nightshift.db") as db:
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            for column in [r[1] for r in db.execute(f"PRAGMA table_info('{table}')")]:
                if db.execute(f"SELECT 1 FROM '{table}' WHERE CAST(\"{column}\" AS TEXT) "
                              "LIKE ? LIMIT 1", (f"%{planted}%",)).fetchone():
                    hits.append(f"store {table}.{column}")
    for path in data_dir.rglob("*"):
        name = str(path.relative_to(data_dir))
        if path.is_file() and not name.startswith(LEFT) and planted.encode() in path.read_bytes():
            hits.append(name)
    for channel in ("general", "other"):
        if planted in json.dumps(notes.list(channel, limit=1 << 20)):
            hits.append(f"a note of {channel}")
    memory = data_dir / "value-memory"
    if memory.is_dir() and planted in json.dumps(ValueMemory(memory, notes._embedder)
                                                  .collection.get(include=["documents"])):
        hits.append("the value memory")
    return hits


class Tools:
    """``note_create`` writes a real note and answers as the tool does; ``read`` returns a
    long text.
    ``before`` runs once before the next call: the forget, landing mid-tool."""

    def __init__(self, notes: NoteStore) -> None:
        self.notes, self.before = notes, None

    def schemas(self) -> list[dict]:
        return TOOLS

    async def call(self, name, arguments, ctx):
        if self.before is not None:
            hook, self.before = self.before, None
            await hook()
        text = json.loads(arguments).get("text", "")
        if name == "note_create":
            note = self.notes.add(ctx.channel, text)
            return _Result(True, f"saved note {note} (for this channel); note_search finds it")
        return _Result(True, f"{text} " + "lorem ipsum " * 300)


class LLM(ScriptedLLM):
    """The scripted model; ``before`` runs once before its next reply (the forget, landing
    while the model writes)."""

    before = None

    async def chat(self, messages: list[dict], **kwargs) -> Reply:
        if self.before is not None:
            hook, self.before = self.before, None
            await hook()
        return await super().chat(messages, **kwargs)


class _Result:
    def __init__(self, ok: bool, output: str) -> None:
        self.ok, self.output, self.meta = ok, output, {}


def world(data_dir: Path, embedder) -> tuple[ChannelSpaces, NoteStore]:
    notes = NoteStore(data_dir / "notes", embedder)
    return ChannelSpaces(data_dir, {}, Services(notes=notes, image_cache=data_dir / "images"),
                         embedder=embedder), notes


def agent(store: Store, spaces: ChannelSpaces, notes: NoteStore, replies: list[Reply],
          summary: str = "") -> tuple[Agent, Tools]:
    """An agent whose context overflows after a long tool output (it then compacts: the
    model's summary is ``summary``)."""
    def script(messages, kwargs):
        if "Summarise this conversation" in str(messages[-1]["content"]):
            return say(summary)
        return replies.pop(0)

    config = Config()
    config.paths.data_dir = spaces.data_dir
    config.model.context_tokens = config.agent.max_reply_tokens + 256 + 500
    config.agent.keep_recent_messages = 2
    tools = Tools(notes)
    return Agent(config, LLM(script), store, tools, context_for=spaces.context), tools


async def forget_open(store: Store, spaces: ChannelSpaces) -> str:
    rows = await store._fetch("SELECT id FROM episodes WHERE status = 'open'")
    return await forget(store, rows[0]["id"], 0, True, spaces)


async def turn_race(tally: Tally, work: Path, embedder, moment: str, n: int) -> None:
    planted = f"PLANTED-turn-{moment}-{n}-{os.urandom(4).hex()}"
    spaces, notes = world(work, embedder)
    async with await Store.open(work / "nightshift.db") as store:
        replies = {"tool": [call("note_create", {"text": planted}), say(planted)],
                   "reply": [say(f"ok {planted}")],
                   "next turn": [say(f"noted {planted}"), call("read", {"text": "x"}),
                                 say("done")]}[moment]
        bot, tools = agent(store, spaces, notes, replies, summary=f"They planted {planted}.")
        if moment == "next turn":  # it read the first in its history, and compacts it
            first = await bot.turn("general", f"remember {planted}")
            tools.before = lambda: forget(store, first.episode_id, 0, True, spaces)
            result = await bot.turn("general", "what did I say?")
            held = result.ok  # its own turn goes on; what it stores holds no text of the first
        else:
            hook = lambda: forget_open(store, spaces)  # noqa: E731
            if moment == "tool":
                tools.before = hook  # the note is written after the forget
            else:
                bot.llm.before = hook
            result = await bot.turn("general", f"remember {planted}")
            held = result.reply == FORGOTTEN_NOTE and await store.is_forgotten(result.episode_id)
        tally.check(f"turn ({moment}) #{n}: the turn stops (or goes on without the text)",
                    held, result)
    left = found(work, planted, notes)
    tally.check(f"turn ({moment}) #{n}: the text is nowhere but where the README says",
                not left, left)


async def night(tally: Tally, work: Path, embedder) -> None:
    planted = f"PLANTED-night-{os.urandom(4).hex()}"
    spaces, notes = world(work, embedder)
    async with await Store.open(work / "nightshift.db") as store:
        bot, _ = agent(store, spaces, notes, [say("noted."), say("ok."), say("fine.")])
        a = (await bot.turn("general", f"remember {planted}")).episode_id
        b = (await bot.turn("general", "and then?")).episode_id  # its history carries a
        c = (await bot.turn("other", "unrelated")).episode_id
        dataset = work / "nights" / "night-0001" / "train.jsonl"
        dataset.parent.mkdir(parents=True)
        dataset.write_text("".join(json.dumps({"episode_id": e, "sources": s, "messages": [
            {"role": "user", "content": planted if a in s else "x"}]}) + "\n"
            for e, s in ((a, [a]), (b, [a, b]), (c, [c]))))
        memory = ValueMemory(work / "value-memory", embedder)
        memory.add_batch([SubTask("general", 0, 1, planted, 1.0, 1, key="k", episodes=[a])], 1, 0.0)
        release = await store.add_release("night-0001", str(work), {
            "trained_episodes": [a, b, c], "gate": {"outcome": "promote"}})
        with holding_value_memory(work):  # the night holds its memory while it runs
            reply = await forget(store, a, 0, True, spaces)
            tally.check("night: the forget leaves a held memory to its night",
                        "until the night now running lets the memory go" in reply, reply)
            kept, _, _ = await drop_forgotten(store, dataset)
            tally.check("night: the rows carrying it are dropped before training",
                        kept == {c} and planted not in dataset.read_text(), kept)
            tally.check("night: the ledger takes no record of it",
                        not await store.put_record(1, "judgment", "general:0",
                                                   {"episodes": [a, b]}))
            try:
                await refuse_if_forgotten(store, [a, b, c], "after training")
                tally.check("night: its release is refused", False, "no refusal")
            except ForgottenAfterTraining as exc:
                tally.check("night: its release is refused", f"#{a}" in str(exc), exc)
            memory.forget(await store.forgotten_episodes())  # what the night does last
        text = await Releases(Config(), store, None).promote(release)
        tally.check("night: /promote refuses the candidate", "refused" in text, text)
        tally.check("night: a purge finds nothing more", purge_value_memory(
            work, await store.forgotten_episodes()) == 0)
    left = found(work, planted, notes)
    tally.check("night: the text is nowhere but where the README says", not left, left)


CHILD = """
import asyncio, sys
from core.storage.store import Step, Store
async def main():
    store = await Store.open(sys.argv[1])
    episode, _ = await store.start_turn("general", "m", [Step(role="user", content=sys.argv[2])])
    while True:
        await store.add_step(episode, Step(role="assistant", content=sys.argv[2] * 40))
        print("ack", flush=True)
asyncio.run(main())
"""


async def crash(tally: Tally, work: Path, embedder, n: int) -> None:
    planted = f"PLANTED-crash-{n}-{os.urandom(4).hex()}"
    spaces, notes = world(work, embedder)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(work / "nightshift.db"), planted, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE)
    for _ in range(5 + 7 * n):  # acknowledged steps, then the kill lands mid-turn
        await child.stdout.readline()
    child.send_signal(signal.SIGKILL)
    await child.wait()
    async with await Store.open(work / "nightshift.db") as store:
        reply = await forget_open(store, spaces)
        status = await store._fetch("SELECT status FROM episodes")
    tally.check(f"crash #{n}: the open episode is forgotten and closed",
                "Its turn had not ended" in reply and status[0]["status"] == "aborted", reply)
    left = found(work, planted, notes)
    tally.check(f"crash #{n}: the text is nowhere but where the README says", not left, left)


async def run(tally: Tally, work: Path, quick: bool) -> None:
    embedder = MiniLMEmbedder()
    rounds = 1 if quick else 3
    for n in range(rounds):
        for moment in ("tool", "reply", "next turn"):
            await turn_race(tally, work / f"turn-{moment}-{n}".replace(" ", "-"), embedder,
                            moment, n)
    await night(tally, work / "night", embedder)
    for n in range(2 if quick else 5):
        await crash(tally, work / f"crash-{n}", embedder, n)
