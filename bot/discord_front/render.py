"""Everything that crosses between Discord and a channel's workspace.

Out: replies are split at Discord's 2,000-character limit without breaking
code blocks; the first chunk replies to the user's message; files the agent
sent are uploaded from its workspace after the text. In: attachments are
saved under ``uploads/`` in the workspace, never overwriting a file, and the
agent is told their names. All user-visible Discord output goes through here
(one seam), so the agent never knows which front end it speaks through.

There are no retry loops: one client process sends for every channel, and
discord.py already waits out 429 rate limits for all of them.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import re
import stat
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath
from typing import Any

import discord

from sandbox.disk_budget import DiskBudget, blocks
from sandbox.shared_limits import usage_bytes
from tools.sizes import human_size

logger = logging.getLogger("nightshift.discord")
LIMIT = 2000
MAX_ATTACHMENT_BYTES = 8 * 1024 * 1024  # per file the user sends us
FILES_PER_MESSAGE = 10  # Discord's limit
DM_FILE_LIMIT = 10 * 1024 * 1024  # Discord's upload limit outside boosted servers
UPLOADS = "uploads"
_UNSAFE = re.compile(r"[^\w.-]+")  # \w is Unicode: letters of any script stay


# -- text ------------------------------------------------------------------------


def split_reply(text: str, limit: int = LIMIT) -> list[str]:
    """Chunks of at most ``limit`` characters, cut at line ends where possible, each with
    balanced code fences: a code block cut in two is closed at the end of one chunk and
    reopened, with its language, at the start of the next; one left open is closed.

    A fence is any ```` ``` ````, counted left to right as Discord and ``str.count`` do,
    so a chunk's fences pair up when their count is even. No cut falls inside a fence
    or an opening fence's language line, so each chunk counts exactly the fences of its
    part of the text. Whitespace-only pieces are dropped (Discord refuses them).
    """
    if limit < 100:
        raise ValueError(f"limit must be at least 100 characters, not {limit}")
    text = text or "(empty reply)"
    fences = [m.start() for m in re.finditer(_FENCE, text)]
    spans = _fence_spans(text, fences)
    chunks: list[str] = []
    start = 0
    while start < len(text):
        prefix = _reopen(text, fences, start) if _inside(fences, start) else ""
        end = _cut(text, start, limit - len(prefix) - len(_CLOSE), spans)
        body = text[start:end].rstrip()
        chunk = prefix + body + (_CLOSE if _inside(fences, end) else "")
        if chunk.strip():
            chunks.append(chunk)
        start = end
    return chunks or ["(empty reply)"]


_FENCE = "```"
_CLOSE = "\n```"
_LANGUAGE = re.compile(r"([A-Za-z0-9_+\-.#]{1,20})\r?\n")  # ```py, as Discord reads it


def _inside(fences: list[int], position: int) -> bool:
    """Whether ``position`` (never inside a fence) lies in an open code block."""
    return bisect.bisect_left(fences, position) % 2 == 1


def _reopen(text: str, fences: list[int], position: int) -> str:
    """The opening fence, with its language, of the block open at ``position``."""
    opening = fences[bisect.bisect_left(fences, position) - 1]
    language = _LANGUAGE.match(text, opening + len(_FENCE))
    return _FENCE + (language.group(1) if language else "") + "\n"


def _fence_spans(text: str, fences: list[int]) -> list[tuple[int, int]]:
    """Where no cut may fall: each fence, and an opening fence's language line with it."""
    spans = []
    for i, at in enumerate(fences):
        language = _LANGUAGE.match(text, at + len(_FENCE)) if i % 2 == 0 else None
        spans.append((at, language.end() if language else at + len(_FENCE)))
    return spans


def _cut(text: str, start: int, room: int, spans: list[tuple[int, int]]) -> int:
    """Where the chunk from ``start`` ends: the text's end, else after the last newline or
    space that fits, else at ``room``; moved off any fence span it falls inside."""
    if len(text) - start <= room:
        return len(text)
    hard = start + room
    end = text.rfind("\n", start, hard) + 1 or text.rfind(" ", start, hard) + 1 or hard
    if end <= start:
        end = hard
    i = bisect.bisect_right(spans, (end, len(text))) - 1
    if i >= 0 and spans[i][0] < end < spans[i][1]:
        end = spans[i][0] if spans[i][0] > start else spans[i][1]
    return end


# -- sending -----------------------------------------------------------------------


async def send_reply(message: discord.Message, text: str,
                     files: Sequence[discord.File] = ()) -> list[discord.Message]:
    """Send ``text`` (split) as a reply to ``message``, then ``files``; return what was sent.

    The files follow in messages of their own (up to ten each), so every text
    chunk stays a plain message whatever happens to an upload.
    """
    # If the user's message is gone, still answer, just not as a reply to it.
    reference = message.to_reference(fail_if_not_exists=False)
    sent = []
    for i, chunk in enumerate(split_reply(text)):
        extra: dict[str, Any] = {"reference": reference} if i == 0 else {}
        sent.append(await message.channel.send(chunk, **extra))
    for start in range(0, len(files), FILES_PER_MESSAGE):
        sent.append(await message.channel.send(files=list(files[start:start + FILES_PER_MESSAGE])))
    return sent


async def answer_interaction(interaction: discord.Interaction, text: str, *,
                             ephemeral: bool = False) -> None:
    """Answer a slash command: a direct response if none was made yet, else followups."""
    chunks = split_reply(text)
    if not interaction.response.is_done():
        await interaction.response.send_message(chunks.pop(0), ephemeral=ephemeral)
    for chunk in chunks:
        await interaction.followup.send(chunk, ephemeral=ephemeral)


def outgoing_files(workspace: Any, paths: Iterable[str],
                   limit: int) -> tuple[list[discord.File], list[str]]:
    """The agent's files to upload, opened inside its workspace, and a note per file skipped.

    ``Workspace.open`` follows no symlink, so a link swapped in after the
    agent named the file cannot send a host file. The caller closes the files.
    """
    files, notes = [], []
    for rel in dict.fromkeys(paths):
        try:
            fp = os.fdopen(workspace.open(rel), "rb")
        except FileNotFoundError:
            notes.append(f"(could not send {rel}: no such file)")
            continue
        except (ValueError, OSError) as exc:
            notes.append(f"(could not send {rel}: {exc})")
            continue
        info = os.fstat(fp.fileno())
        problem = ("it is a folder" if not stat.S_ISREG(info.st_mode) else
                   f"{human_size(info.st_size)} is over Discord's {human_size(limit)} upload "
                   "limit here" if info.st_size > limit else "")
        if problem:
            fp.close()
            notes.append(f"(could not send {rel}: {problem})")
            continue
        files.append(discord.File(fp, filename=PurePosixPath(rel).name))
    return files, notes


def upload_limit(message: discord.Message) -> int:
    guild = message.guild
    return guild.filesize_limit if guild is not None else DM_FILE_LIMIT


# -- receiving -----------------------------------------------------------------------


def safe_name(filename: str) -> str:
    """A file name that is plain on every system: no path, no leading dot, at most 100 chars."""
    name = _UNSAFE.sub("_", os.path.basename(filename.replace("\\", "/"))).lstrip("._")
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    ext = ext[:16]
    stem = stem[:100 - len(ext) - 1] or "file"
    return f"{stem}.{ext}" if ext else stem


async def save_attachments(attachments: Sequence[discord.Attachment], workspace: Any,
                           max_bytes: int = MAX_ATTACHMENT_BYTES,
                           quota_bytes: int | None = None, disk: DiskBudget | None = None,
                           channel: str | None = None) -> list[str]:
    """Save each attachment under ``uploads/``; one line per attachment for the agent.
    With ``quota_bytes`` (the workspace's quota) one that would fill the workspace past
    it is not saved, as a file the agent wrote would not be: attachments counted for
    nothing, and five messages put 400 MiB into a 10 MiB workspace. With ``disk``, one
    that the data folder's budget or ``channel``'s shares have no room for is not saved
    either (its announced size is claimed before it is read, the rest after)."""
    notes = []
    for attachment in attachments:
        name = safe_name(attachment.filename)
        if attachment.size > max_bytes:
            notes.append(f"[not saved: {name} ({human_size(attachment.size)}) is over the "
                         f"{human_size(max_bytes)} limit]")
            continue
        try:
            if quota_bytes is not None:
                used = await asyncio.to_thread(usage_bytes, workspace.root)
                if used + attachment.size > quota_bytes:
                    raise ValueError(f"the workspace holds {human_size(used)} of its "
                                     f"{human_size(quota_bytes)} quota; delete files first")
            target = workspace.root / UPLOADS
            if disk is not None:  # DiskFull is a ValueError: the note says what is full
                disk.claim(target, blocks(attachment.size), channel)
            data = await attachment.read()
            if len(data) > max_bytes:
                raise ValueError(f"{human_size(len(data))} is over the "
                                 f"{human_size(max_bytes)} limit")
            if disk is not None:  # its announced size lied: claim the rest too
                disk.claim(target, blocks(len(data)) - blocks(attachment.size), channel)
            if quota_bytes is not None and used + len(data) > quota_bytes:  # its size lied
                raise ValueError(f"it would fill the workspace past its "
                                 f"{human_size(quota_bytes)} quota")
            rel = await asyncio.to_thread(_write_free, workspace, name, data)
        except (discord.HTTPException, ValueError, OSError) as exc:
            logger.warning("attachment %s not saved: %s", name, exc)
            notes.append(f"[not saved: {name} ({exc})]")
            continue
        notes.append(f"[attached: {rel} ({human_size(len(data))})]")
    return notes


def _write_free(workspace: Any, name: str, data: bytes) -> str:
    """Write ``data`` under a free name in uploads/ and return its workspace path.

    Exclusive creation (O_EXCL) means an existing file is never overwritten,
    even by two uploads racing for one name; ``Workspace.open`` follows no
    symlink, so a link planted in uploads/ cannot lead the write out.
    """
    workspace.resolve(UPLOADS).mkdir(parents=True, exist_ok=True)
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    for n in range(1000):
        rel = f"{UPLOADS}/{name if n == 0 else f'{stem}-{n}' + ('.' + ext if ext else '')}"
        try:
            fd = workspace.open(rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        return rel
    raise OSError(f"no free name for {name} in {UPLOADS}/")


# -- progress --------------------------------------------------------------------


class TurnStatus:
    """A short status message for a turn that runs longer than ``after_s``.

    Typing shows that the bot is at work, but not for how long nor on what. Past
    the threshold one message is sent naming the agent's current step (from
    ``Agent.progress``), edited as the steps change (at most one edit per
    ``edit_every_s``, since Discord rate-limits edits), and deleted when the
    turn ends: the reply is the record, the status only a sign of life.
    A failed send or edit is logged and ends the status; it never ends the turn.
    """

    def __init__(self, channel: discord.abc.Messageable, after_s: float,
                 edit_every_s: float = 2.0) -> None:
        self.channel, self.after_s = channel, after_s
        self.edit_every_s = min(edit_every_s, after_s)
        self.text = "starting"
        self.message: discord.Message | None = None
        self._changed = asyncio.Event()
        self._started = asyncio.get_running_loop().time()

    def update(self, text: str) -> None:
        self.text = text
        self._changed.set()

    def line(self) -> str:
        elapsed = asyncio.get_running_loop().time() - self._started
        return f"\N{HOURGLASS WITH FLOWING SAND} working ({elapsed:.0f} s): {self.text}"

    async def run(self) -> None:
        try:
            await asyncio.sleep(self.after_s)
            self.message = await self.channel.send(self.line())
            while True:
                await self._changed.wait()
                self._changed.clear()
                await self.message.edit(content=self.line())
                await asyncio.sleep(self.edit_every_s)  # later changes wait: one edit
        except discord.HTTPException as exc:
            logger.warning("turn status message failed: %s", exc)

    async def remove(self) -> None:
        if self.message is not None:
            try:
                await self.message.delete()
            except discord.HTTPException as exc:
                logger.warning("could not delete a turn status message: %s", exc)


class TurnStatuses:
    """The status of each channel's running turn; ``update`` is ``Agent.progress``."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._live: dict[str, list[TurnStatus]] = {}

    def update(self, key: str, text: str) -> None:
        waiting = self._live.get(key)
        if waiting:
            waiting[0].update(text)  # a channel's turns run in order: the first is running

    @contextlib.asynccontextmanager
    async def showing(self, key: str, channel: discord.abc.Messageable):
        if self.after_s <= 0:
            yield None
            return
        status = TurnStatus(channel, self.after_s)
        self._live.setdefault(key, []).append(status)
        task = asyncio.create_task(status.run(), name=f"status:{key}")
        try:
            yield status
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self._live[key].remove(status)
            if not self._live[key]:
                del self._live[key]
            await status.remove()
