"""The bot's runtime: store, supervised model server, agent, one front end.

Owns every long-lived resource and closes them in reverse order, whether the
front end ends at EOF, by /quit, by Ctrl-C or by an error.
"""

from __future__ import annotations

import logging
import sys
from contextlib import AsyncExitStack

from bot.agent import Agent
from bot.config import Config
from bot.console import ConsoleRenderer, run_console
from bot.llm import LLM
from bot.server import ServerSupervisor
from bot.store import Store

logger = logging.getLogger("nightshift")


async def status_text(supervisor: ServerSupervisor, store: Store) -> str:
    episodes = await store.episodes_since(0.0)
    server = "ready" if supervisor.ready else "not ready"
    return (f"model: {supervisor.gguf.name} at {supervisor.base_url} ({server}, "
            f"pid {supervisor.pid}, restarts {supervisor.restarts}, "
            f"last restart: {supervisor.last_restart_reason or 'none'})\n"
            f"store: {store.path} schema v{store.schema_version}, {len(episodes)} episodes")


async def run_bot(config: Config) -> int:
    renderer = ConsoleRenderer()
    async with AsyncExitStack() as stack:
        store = await Store.open(config.store_path)
        stack.push_async_callback(store.close)
        supervisor = ServerSupervisor(config)
        renderer.info(f"starting the model server ({config.server.kind}, "
                      f"{supervisor.gguf.name}) ...")
        stack.push_async_callback(supervisor.stop)
        await supervisor.start()
        renderer.info(f"model server ready at {supervisor.base_url}")
        llm = LLM(config, supervisor)
        stack.push_async_callback(llm.close)
        agent = Agent(config, llm, store)

        async def turn(channel: str, text: str, speaker: str = "user") -> str:
            return (await agent.turn(channel, text, speaker)).reply

        async def command(line: str) -> str:
            if line == "/status":
                return await status_text(supervisor, store)
            return f"unknown command {line!r}; /help lists the commands"

        token = config.secret("discord.token_env")
        if token:
            from bot.discord_app import NightshiftClient

            client = NightshiftClient(turn)
            stack.push_async_callback(client.close)
            renderer.info("joining Discord ...")
            await client.start(token)
        else:
            renderer.info(f"no Discord token in ${config.discord.token_env}: local console")
            await run_console(turn, command, renderer, sys.stdin)
    return 0
