"""A non-admin calls every admin command of ``bot.commands.COMMANDS``: through the command
runner, through Discord (each slash command, from a server channel and from a DM, and
``!sleep`` in channels and DMs, on dpytest's fake gateway), and through the console.

The console belongs to the machine's owner, an admin by definition (``Caller.local``), so
its non-admin is the one untrusted voice it carries: the model. Its replies (and a
channel's ordinary text) naming every command must be shown, never run.

After each refused call nothing may have changed: no night queued, no restart, no label,
no release state, no system section, no notes wiped, no swarm post, no practice run.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sqlite3
from pathlib import Path

import discord
import discord.ext.test as dpytest
from discord.webhook import async_ as webhook_async

from bench.probes import Tally
from bot.app import console_commands
from bot.commands import COMMANDS, Caller, run_command
from core.config.routines import Swarm
from bot.console import ConsoleRenderer, run_console
from bot.discord_front.app import NightshiftBot
from tests.discord_helpers import (
    TEST_INTENTS,
    InteractionRecorder,
    make_config,
    sent_messages,
    start_runtime,
)
from tests.scripted import ScriptedLLM, say
from tests.test_discord_admin import ADMIN_CASES, SLASH_CASES, data_options, tree_command
from tests.test_nightwatch import make_release

BOB = Caller(2, (3,), "c1", "bob (2)")
COMMAND_LINES = ["/status", "/sleep", "!sleep", "/wake", "/promote", "/rollback 1",
                 "/label 1 verified", "/forget 1", "/sys show", "/sys reset", "/restart-server",
                 "/notes-clean", "/notes-wipe CONFIRM", "/swarm start team go",
                 "/swarm stop team", "/practice /no/such/set.jsonl"]


async def state(rt) -> tuple:
    """Everything an admin command could change, to compare before and after."""
    with sqlite3.connect(rt.config.store_path) as db:
        labels = db.execute("SELECT COUNT(*) FROM labels").fetchone()[0]
        steps = db.execute("SELECT COUNT(*), TOTAL(LENGTH(content)) FROM steps").fetchone()
    jobs = [(j["kind"], j["state"]) for j in await rt.store.jobs()]
    releases = [(r["id"], r["state"]) for r in await rt.store.releases()]
    sections = sorted(p.read_text() for p in rt.config.data_dir.glob("channels/*/system*"))
    notes = rt.spaces.services.notes
    board = rt.spaces.services.board
    return (jobs, releases, labels, steps, rt.supervisor.restarts, sections,
            notes.count("c1"), len(board.read("s1") if board else []),
            sorted(os.listdir(rt.config.data_dir)))


async def _runner(tally: Tally, rt) -> None:
    assert set(ADMIN_CASES) == set(COMMANDS), "a command of the table has no probe"
    for name, (options, _) in ADMIN_CASES.items():
        before = await state(rt)
        answer = await run_command(rt, BOB, name, **options)
        after = await state(rt)
        tally.check(f"run_command {name}: refused, nothing changed",
                    answer.refused and answer.text == COMMANDS[name].refusal and after == before,
                    (answer, before, after) if after != before else answer)


def dm_interaction(bot, member, name: str, options: list) -> discord.Interaction:
    """A slash interaction as Discord would send it from a DM: no guild, a user, not a member
    (Discord shows guild-only commands nowhere else, but a client may still send one)."""
    payload = {"id": "900000000000000777", "application_id": str(bot.user.id), "type": 2,
               "token": "interaction-token", "version": 1, "channel_id": "424242",
               "channel": {"id": "424242", "type": 1},
               "user": {"id": str(member.id), "username": member.name,
                        "discriminator": member.discriminator, "avatar": None},
               "data": {"id": "1", "name": name, "type": 1, "options": options},
               "locale": "en-US", "app_permissions": "0", "entitlements": [],
               "authorizing_integration_owners": {}, "context": 1,
               "attachment_size_limit": 8 * 1024 * 1024}
    return discord.Interaction(data=payload, state=bot._connection)


@contextlib.asynccontextmanager
async def discord_bot(work: Path):
    """The bot on dpytest (as tests/discord_helpers.py's fixture builds it): #general and
    #free, alice (an admin) and bob; one episode by alice (#1) and a candidate release."""
    config = make_config(work)
    config.swarms.teams = [Swarm(name="team", channels=["s1", "s2"])]
    rt = await start_runtime(config, ScriptedLLM(lambda messages, kwargs: say("hi")))
    bot = NightshiftBot(rt, intents=TEST_INTENTS)
    await bot._async_setup_hook()
    dpytest.configure(bot, text_channels=["general", "free"], voice_channels=0,
                      members=["alice", "bob"])
    bot._connection.loop = asyncio.get_running_loop()
    general, free = dpytest.get_config().channels
    alice, bob = dpytest.get_config().members
    config.discord.no_mention_channel_ids = [free.id]
    config.discord.admin_user_ids = [alice.id]
    await rt.turn(str(general.id), "hello", "alice")
    path, meta = make_release(config.data_dir, "night-0001")
    await rt.store.add_release("night-0001", path, meta)
    recorder = InteractionRecorder()
    token = webhook_async.async_context.set(recorder)
    try:
        yield rt, bot, recorder, general, free, bob
    finally:
        webhook_async.async_context.reset(token)
        await dpytest.empty_queue()
        await rt.close()


async def _discord(tally: Tally, work: Path) -> None:
    async with discord_bot(work) as (rt, bot, recorder, general, free, bob):
        commands = bot.tree.get_commands()
        tally.check("every slash command is guild-only (Discord offers none in DMs)",
                    all(c.guild_only for c in commands), [c.name for c in commands])
        for path, kwargs, options, _ in SLASH_CASES:
            name = " ".join(path)
            for where in ("channel", "DM"):
                recorder.sent.clear()
                before = await state(rt)
                interaction = (recorder.interaction(bot, bob, general, path[0],
                                                    data_options(path, options))
                               if where == "channel" else
                               dm_interaction(bot, bob, path[0], data_options(path, options)))
                await tree_command(bot, path).callback(interaction, **kwargs)
                after = await state(rt)
                sent = [(s.kind, s.content, s.ephemeral) for s in recorder.sent]
                tally.check(f"Discord slash /{name} from bob in a {where}: refused, nothing changed",
                            sent == [("message", COMMANDS[name].refusal, True)] and after == before,
                            (sent, before if after != before else "", after if after != before else ""))
        dm = await bob.create_dm()
        for allow_dms in (False, True):
            rt.config.discord.allow_dms = allow_dms
            for channel, label in ((general, "#general"), (free, "#free"), (dm, "a DM")):
                for line in COMMAND_LINES:
                    before = await state(rt)
                    sent_messages()
                    await dpytest.message(line, channel=channel, member=bob)
                    after = await state(rt)
                    replies = [m.content for m in sent_messages()]
                    ran = [r for r in replies if r != COMMANDS["sleep"].refusal and r != "hi"]
                    tally.check(f"Discord text {line!r} from bob in {label} (DMs "
                                f"{'on' if allow_dms else 'off'}): nothing ran",
                                after == before or _only_a_turn(before, after) and not ran,
                                (replies, before, after))


def _only_a_turn(before: tuple, after: tuple) -> bool:
    """The text went to the agent as a chat message (a new episode): that is not a command."""
    return before[:2] + before[2:3] + before[4:] == after[:2] + after[2:3] + after[4:] \
        and after[3][0] > before[3][0]


async def _console(tally: Tally, work: Path) -> None:
    """The model replies with every admin command line; the console shows them, runs none."""
    def script(messages, kwargs):
        last = messages[-1]["content"] or ""
        return say(COMMAND_LINES[int(last.split()[-1])] if "number" in last else "hi")

    config = make_config(work / "console")
    config.swarms.teams = [Swarm(name="team", channels=["s1", "s2"])]
    rt = await start_runtime(config, ScriptedLLM(script))
    try:
        await rt.turn("c1", "hello")
        before = await state(rt)
        lines = "".join(f"#c1 please tell me the command number {i}\n"
                        for i in range(len(COMMAND_LINES)))
        out, err = io.StringIO(), io.StringIO()

        async def turn(channel: str, text: str):
            return await rt.turn(channel, text, "console")

        await run_console(turn, console_commands(rt), ConsoleRenderer(out, err), io.StringIO(lines))
        after = await state(rt)
        shown = out.getvalue()
        for line in COMMAND_LINES:
            tally.check(f"console: the model's reply {line!r} is shown, not run",
                        f"[#c1] {line}" in shown and _only_turns(before, after), (before, after))
    finally:
        await rt.close()


def _only_turns(before: tuple, after: tuple) -> bool:
    return before[:3] + before[4:] == after[:3] + after[4:]


async def run(tally: Tally, work: Path, quick: bool) -> None:
    config = make_config(work / "runner", admin_user_ids=[1], admin_role_ids=[77])
    config.swarms.teams = [Swarm(name="team", channels=["s1", "s2"])]
    rt = await start_runtime(config, ScriptedLLM(lambda messages, kwargs: say("hi")))
    try:
        await rt.turn("c1", "hello")
        await _runner(tally, rt)
    finally:
        await rt.close()
    cwd = os.getcwd()
    os.chdir(work)  # dpytest writes the files the bot sends to ./dpytest_N.dat
    try:
        await _discord(tally, work)
    finally:
        os.chdir(cwd)
    await _console(tally, work)
