"""Swarms: several channels working on one task through a shared board.

``/swarm start NAME TASK`` posts the task on the swarm's board
(``tools.board``), which also puts a section in each member's system prompt
telling it to claim a sub-task on the board before working and to post its
result. Each member channel then gets one turn, queued on its own worker as
any message is, so the members work concurrently and each turn is an episode
like any other. While those turns run, the swarm is a round in progress: a
scheduled night waits for it. Each member's reply is announced in its
channel (Discord or the console) through the runtime's announcers.

``Swarms`` owns the tasks that follow the member turns and cancels them on close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from bot.channels import Busy
from bot.night.schedule import Rounds

if TYPE_CHECKING:
    from bot.channels import ChannelWorkers
    from tools.board import Board

logger = logging.getLogger("nightshift.swarm")
KICKOFF = ("The swarm {name!r} starts on this task:\n{task}\n\nRead the board (board_read), "
           "claim one sub-task nobody has claimed (board_post with topic 'claims'), do it, and "
           "post your result (board_post with topic 'results').")


class Swarms:
    def __init__(self, board: Board | None, workers: ChannelWorkers, rounds: Rounds,
                 announce: Callable[[str, str], Awaitable[None]]) -> None:
        self.board = board
        self.workers = workers
        self.rounds = rounds
        self.announce = announce
        self._tasks: set[asyncio.Task] = set()

    def _board(self) -> Board:
        if self.board is None:
            raise ValueError("no swarms are configured; add one under [swarms] teams in "
                             "config.toml")
        return self.board

    async def start(self, name: str, task: str) -> str:
        board = self._board()
        task = task.strip()
        if not task:
            raise ValueError("the task is empty; say what the swarm should do")
        post = await asyncio.to_thread(board.start, name, task)
        members = board.swarms[name]
        followed: list[Awaitable[Any]] = []
        refused = []
        for channel in members:
            try:
                future = self.workers.enqueue(channel, KICKOFF.format(name=name, task=task),
                                              f"swarm {name}")
            except Busy:
                refused.append(channel)
                continue
            followed.append(self._follow(name, channel, future))
        if followed:
            self.rounds.add(f"swarm:{name}")
            job = asyncio.create_task(self._all(name, followed), name=f"swarm:{name}")
            self._tasks.add(job)
            job.add_done_callback(self._tasks.discard)
        busy = f" Busy, not started: {', '.join(refused)}." if refused else ""
        return (f"Swarm {name} started on board post #{post}: {len(followed)} of {len(members)} "
                f"channels are working on it.{busy}")

    async def stop(self, name: str) -> str:
        board = self._board()
        if name not in board.swarms:
            raise ValueError(f"there is no swarm {name!r}; the swarms are: "
                             f"{', '.join(board.swarms)}")
        stopped = await asyncio.to_thread(board.stop, name)
        return (f"Swarm {name}'s task is cleared from its members' prompts; the board keeps "
                "its posts." if stopped else f"Swarm {name} has no task.")

    async def _all(self, name: str, followed: list[Awaitable[Any]]) -> None:
        try:
            await asyncio.gather(*followed)
        finally:
            self.rounds.discard(f"swarm:{name}")

    async def _follow(self, name: str, channel: str, future: asyncio.Future) -> None:
        try:
            result = await future
            text = result.reply
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one member's failure is told, the others go on
            logger.exception("swarm %s: the turn in #%s failed", name, channel)
            text = f"(swarm {name}: this channel's turn failed: {exc})"
        await self.announce(channel, text)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
