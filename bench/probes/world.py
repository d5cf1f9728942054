"""The real runtime the probes attack: store, tools, sandbox, channel workers, scripted model.

Built as the Discord tests build it (tests/discord_helpers.py): a real Runtime
with every tool, a fake model-server supervisor and a scripted model, so the
probes go through the same ChannelSpaces, registry and sandbox as the bot.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

from bot.runtime import Runtime
from tests.discord_helpers import make_config, start_runtime
from tests.scripted import ScriptedLLM, say
from tools import ToolResult


@contextlib.asynccontextmanager
async def runtime(work: Path, script=None, **config_fields) -> AsyncIterator[Runtime]:
    config = make_config(work)
    for dotted, value in config_fields.items():
        section, key = dotted.split("__")
        setattr(getattr(config, section), key, value)
    llm = ScriptedLLM(script or (lambda messages, kwargs: say("ok")))
    rt = await start_runtime(config, llm)
    try:
        yield rt
    finally:
        await rt.close()


async def call(rt: Runtime, channel: str, name: str, /, **arguments) -> ToolResult:
    """A tool call as the agent makes it: through the registry, in the channel's context."""
    return await rt.registry.call(name, arguments, rt.spaces.context(channel))


def verdict(result: ToolResult) -> dict | None:
    """The ``VERDICT {...}`` line a probe program printed, if any."""
    for line in reversed(result.output.splitlines()):
        if line.startswith("VERDICT "):
            return json.loads(line[len("VERDICT "):])
    return None


def processes_with(token: str) -> list[int]:
    """Pids whose command line holds ``token``: what a probe left running."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if token.encode() in Path(entry.path, "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
