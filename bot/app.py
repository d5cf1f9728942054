"""Start the bot: Discord if a token is configured, else the local console."""

from __future__ import annotations

import sys

from bot import admin
from bot.channels import Busy
from bot.config import Config
from bot.console import ConsoleRenderer, run_console
from bot.runtime import Runtime
from sandbox.process import unsandboxed_warning


def console_commands(rt: Runtime) -> object:
    """The console's slash commands; the local user is an admin."""

    async def command(line: str, channel: str) -> str:
        name, *args = line.split()
        try:
            if name in ("/sleep", "!sleep"):
                return await admin.sleep(rt, "console", channel)
            if name == "/label" and len(args) == 2:
                return await admin.label(rt, int(args[0]), args[1], "admin")
            if name == "/sys" and args in (["show"], ["reset"]):
                return await (admin.sys_show if args[0] == "show" else admin.sys_reset)(rt, channel)
            if name in ("/promote", "/rollback") and len(args) <= 1:
                action = admin.promote if name == "/promote" else admin.rollback
                return await action(rt, int(args[0]) if args else None)
            simple = {"/status": admin.status, "/wake": admin.wake,
                      "/restart-server": admin.restart_server}
            if name in simple and not args:
                return await simple[name](rt)
            if name == "/notes-clean" and not args:
                return await admin.notes_clean(rt, channel)
        except ValueError:
            pass
        return f"unknown or malformed command {line!r}; /help lists the commands"

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
            from bot.discord_app import run_discord

            renderer.info("joining Discord ...")
            await run_discord(rt, token)
        else:
            renderer.info(f"no Discord token in ${config.discord.token_env}: local console")
            from bot.nightwatch import night_line

            async def night_progress(job: dict) -> None:
                renderer.info(night_line(job))

            rt.night.listeners.append(night_progress)

            async def turn(channel: str, text: str):
                if rt.night.asleep:
                    renderer.info("(asleep: training has the GPU; the message is queued)")
                try:
                    return await rt.turn(channel, text, "console")
                except Busy as exc:
                    return str(exc)

            await run_console(turn, console_commands(rt), renderer, sys.stdin)
    finally:
        await rt.close()
    return 0
