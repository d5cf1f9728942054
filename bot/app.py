"""Start the bot: Discord if a token is configured, else the local console."""

from __future__ import annotations

import asyncio
import sys

from bot.channels import Busy
from bot.commands import Caller, CommandError, parse_command, run_command
from bot.console import ConsoleRenderer, run_console
from bot.disk.workspaces import SpaceRefused
from bot.night.jobs import ACTIVE, night_line, pid_alive
from bot.runtime import Runtime
from core.config import Config
from sandbox.process import unsandboxed_warning


def console_commands(rt: Runtime) -> object:
    """The console's slash commands, from ``bot.commands``; the local user is an admin."""

    async def command(line: str, channel: str) -> str:
        try:
            name, options = parse_command(line)
        except CommandError as exc:
            return str(exc)
        caller = Caller(0, (), channel, "console", local=True)
        return (await run_command(rt, caller, name, **options)).text

    return command


def console_report(renderer: ConsoleRenderer):
    """The console's night report listener: the text, then each plot's path."""

    async def show(report) -> None:
        renderer.reply(report.channel or "night", report.text,
                       [str(path) for path in report.files])

    return show


def _unfinished(job: dict, auto_promote: bool) -> bool:
    """Under way in a live trainer process (the watch marks a dead one failed), or about
    to be promoted by the watch (auto-promote, not yet tried)."""
    if job["state"] in ACTIVE:
        return pid_alive(job["pid"])
    return (auto_promote and job["state"] == "awaiting_promotion"
            and "promotion" not in job["progress"])


async def finish_nights(rt: Runtime, renderer: ConsoleRenderer, interval_s: float = 2.0) -> None:
    """At the console's end of input, let a running night finish instead of killing it.

    Closing the runtime stops the model server that the night judges with, and the
    nights this bot started, so the bot waits here, saying so, sends each night's report
    (the watch polls too, and stopping would cut a report it had not sent yet) and says
    how each night ended. Ctrl-C still stops at once (the night can then be resumed)."""
    auto = rt.config.night.auto_promote
    waiting = [j for j in await rt.store.jobs("sleep") if _unfinished(j, auto)]
    if not waiting:
        return
    names = ", ".join(f"#{j['id']}" for j in waiting)
    renderer.info(f"End of input, but night {names} is still running: waiting for it to "
                  "finish before stopping (Ctrl-C stops now; the night can be resumed with "
                  "python -m trainer sleep --job N).")
    for job in waiting:
        while _unfinished(job, auto):
            await asyncio.sleep(interval_s)
            job = await rt.store.job(job["id"])
        if rt.reports is not None:  # sent here unless the watch has: closing would cut it
            await rt.reports.on_job(job)
        renderer.info(f"The night finished: {night_line(job)}")


async def run_bot(config: Config) -> int:
    renderer = ConsoleRenderer()
    warning = unsandboxed_warning(config.sandbox.allow_unsandboxed)
    if warning:
        renderer.info(warning)
    renderer.info(f"starting the model server ({config.server.kind}, {config.served_gguf.name}) ...")
    rt = await Runtime.start(config)
    try:
        renderer.info(f"model server ready at {rt.supervisor.base_url}")
        token = config.secret("discord.token_env")
        if token:
            from bot.discord_front.app import run_discord

            renderer.info("joining Discord ...")
            await run_discord(rt, token)
        else:
            renderer.info(f"no Discord token in ${config.discord.token_env}: local console")
            async def night_progress(job: dict) -> None:
                renderer.info(night_line(job))

            rt.night.listeners.append(night_progress)
            rt.agent.progress = renderer.progress

            async def announce(channel: str, text: str) -> None:
                if channel:
                    renderer.reply(channel, text)
                else:
                    renderer.info(text)

            rt.announcers.append(announce)
            if rt.reports is not None:
                rt.reports.listeners.append(console_report(renderer))

            async def practice_progress(line: str) -> None:
                renderer.info(line)

            rt.practice.listeners.append(practice_progress)

            async def turn(channel: str, text: str):
                if rt.night.server_paused:
                    renderer.info("(asleep: training has the GPU; the message is queued)")
                try:
                    return await rt.turn(channel, text, "console")
                except (Busy, SpaceRefused) as exc:
                    return str(exc)

            await run_console(turn, console_commands(rt), renderer, sys.stdin)
            if rt.selfplay is not None and rt.selfplay.running:  # piped input ends at once
                renderer.info("self-play is still running; waiting for its end (Ctrl-C stops it)")
                await rt.selfplay.join()
            await finish_nights(rt, renderer)
    finally:
        await rt.close()
    return 0
