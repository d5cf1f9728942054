"""The local console front end: ``#name text`` speaks in channel ``name``.

It reads lines from standard input (a terminal or a pipe), so
``printf '#general hello\n' | make run`` prints the reply and exits at EOF.
A line without ``#name`` goes to the channel used last (``general`` at first).
Everything the user sees goes through ``ConsoleRenderer``. What answers a line
(a reply, a command's answer, /help) goes to stdout, so a pipe captures it.
While a turn runs, the agent's progress (the step, the tool being run) goes to
stderr: one line per update in a pipe, or one line rewritten in place on a
terminal, cleared when the reply comes; so do notices and the prompt.
"""

from __future__ import annotations

import asyncio
import re
import sys
from dataclasses import dataclass
from typing import Awaitable, Callable, TextIO

from bot.commands import help_lines

_LINE = re.compile(r"^#([A-Za-z0-9_-]{1,64})\s+(.*)$", re.DOTALL)
HELP = "\n".join([
    "#channel text          speak in a channel (the channel is created on first use)",
    "text                   speak in the channel used last",
    "!sleep                 the same as /sleep",
    *help_lines(),
    "/help                  this help",
    "/quit                  stop (EOF, Ctrl-D, does the same)",
])


@dataclass
class ConsoleLine:
    channel: str
    text: str


def parse_line(line: str, default_channel: str) -> ConsoleLine | None:
    """A console line as (channel, text); None for a blank line."""
    line = line.strip()
    if not line:
        return None
    match = _LINE.match(line)
    if match:
        return ConsoleLine(match.group(1), match.group(2).strip())
    if line.startswith("#"):
        return ConsoleLine(line[1:].split()[0][:64] if line[1:].split() else default_channel, "")
    return ConsoleLine(default_channel, line)


class ConsoleRenderer:
    """The one seam for console output."""

    def __init__(self, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.out, self.err = out, err
        self._live = err.isatty()  # rewrite one status line in place
        self._shown = False  # a live status line is on screen

    def progress(self, channel: str, text: str) -> None:
        """What a running turn is doing (``Agent.progress``); stderr, never the replies."""
        if self._live:
            print(f"\r\x1b[K[#{channel}] ... {text}", end="", file=self.err, flush=True)
            self._shown = True
        else:
            print(f"[#{channel}] ... {text}", file=self.err, flush=True)

    def _clear(self) -> None:
        if self._shown:
            print("\r\x1b[K", end="", file=self.err, flush=True)
            self._shown = False

    def reply(self, channel: str, text: str, files: list[str] = ()) -> None:
        self._clear()
        print(f"[#{channel}] {text}", file=self.out, flush=True)
        for name in files:
            print(f"[#{channel}] (file sent: {name})", file=self.out, flush=True)

    def answer(self, text: str) -> None:
        """What answers a command line (``/status``, ``!sleep``, ``/help``)."""
        self._clear()
        print(text, file=self.out, flush=True)

    def info(self, text: str) -> None:
        self._clear()
        print(text, file=self.err, flush=True)


Turn = Callable[[str, str], Awaitable[object]]  # returns a TurnResult or a text
Command = Callable[[str, str], Awaitable[str]]  # (command line, current channel)


async def run_console(turn: Turn, command: Command, renderer: ConsoleRenderer,
                      stdin: TextIO = sys.stdin) -> None:
    """Read lines until EOF or /quit; each line is answered before the next is read."""
    interactive = stdin.isatty()
    channel = "general"
    if interactive:
        renderer.info("Nightshift console. /help for help.")
    while True:
        if interactive:
            print(f"#{channel}> ", end="", file=renderer.err, flush=True)
        line = await asyncio.to_thread(stdin.readline)
        if not line:
            return
        stripped = line.strip()
        if stripped in ("/quit", "/exit"):
            return
        if stripped == "/help":
            renderer.answer(HELP)
            continue
        parsed = parse_line(line, channel)
        if parsed is None:
            continue
        channel = parsed.channel
        if parsed.text.startswith(("/", "!sleep")):
            renderer.answer(await command(parsed.text, channel))
            continue
        if not parsed.text:
            renderer.info(f"(now in #{channel})")
            continue
        result = await turn(channel, parsed.text)
        if isinstance(result, str):
            renderer.reply(channel, result)
        else:
            renderer.reply(channel, result.reply, result.files)
