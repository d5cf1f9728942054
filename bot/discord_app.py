"""The Discord front end (discord.py 2.7).

It answers direct messages and messages that mention the bot, through the same
agent turn as the console. Replies are split at Discord's 2,000-character
limit without breaking code blocks. One client process sends for every
channel, so discord.py's own 429 handling covers all of them.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

import discord

logger = logging.getLogger("nightshift.discord")
LIMIT = 2000
Turn = Callable[[str, str, str], Awaitable[str]]


def split_reply(text: str, limit: int = LIMIT) -> list[str]:
    """Chunks of at most ``limit`` characters, cut at line ends where possible.
    A code block cut in two is closed at the end of one chunk and reopened, with
    its language, at the start of the next."""
    close = "\n```"
    chunks: list[str] = []
    fence = ""  # the opening fence line (e.g. ```py) while inside a code block
    current = ""
    for line in _pieces(text or "(empty reply)", limit - 2 * len(close) - 16):
        reserve = len(close) if fence else 0
        if current and len(current) + len(line) + reserve > limit:
            chunks.append(current.rstrip("\n") + (close if fence else ""))
            current = fence + "\n" if fence else ""
        current += line
        if line.lstrip().startswith("```"):
            fence = "" if fence else line.strip()
    if current.strip() and current.strip() != fence:
        chunks.append(current.rstrip("\n"))
    return chunks


def _pieces(text: str, width: int) -> list[str]:
    """Lines with their newlines; a line longer than ``width`` is cut into parts."""
    out = []
    for line in text.splitlines(keepends=True):
        out += [line[i:i + width] for i in range(0, len(line), width)]
    return out


class NightshiftClient(discord.Client):
    def __init__(self, turn: Turn) -> None:
        intents = discord.Intents.default()
        intents.message_content = True
        super().__init__(intents=intents)
        self._turn = turn

    async def on_ready(self) -> None:
        logger.info("logged in to Discord as %s", self.user)

    async def on_message(self, message: discord.Message) -> None:
        if message.author.bot or self.user is None:
            return
        direct = message.guild is None
        if not direct and not self.user.mentioned_in(message):
            return
        text = message.content.replace(self.user.mention, "").strip()
        if not text:
            return
        channel = f"dm-{message.author.id}" if direct else f"{message.channel.id}"
        async with message.channel.typing():
            reply = await self._turn(channel, text, message.author.display_name)
        for chunk in split_reply(reply):
            await message.channel.send(chunk)
