"""Start the bot: Discord if a token is configured, else the local console."""

from __future__ import annotations

import sys

from bot.channels import Busy
from bot.commands import Caller, CommandError, parse_command, run_command
from bot.config import Config
from bot.console import ConsoleRenderer, run_console
from bot.night.jobs import night_line
from bot.runtime import Runtime
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

            async def practice_progress(line: str) -> None:
                renderer.info(line)

            rt.practice_listeners.append(practice_progress)

            async def turn(channel: str, text: str):
                if rt.night.server_paused:
                    renderer.info("(asleep: training has the GPU; the message is queued)")
                try:
                    return await rt.turn(channel, text, "console")
                except Busy as exc:
                    return str(exc)

            await run_console(turn, console_commands(rt), renderer, sys.stdin)
    finally:
        await rt.close()
    return 0
