"""What the swap and the watchdog need of the server they act on: the supervisor's public
interface, as a Protocol. ``serving.supervisor`` implements it and calls them; they import
this, not the supervisor, so the three are not a circle."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

from core.config import Config
from serving.kinds import ServerKind


class Served(Protocol):
    config: Config
    kind: ServerKind
    gguf: Path
    lora: Path | None
    generation: int  # counts the processes served; a swap or restart makes a new one
    healthy: bool  # the watchdog's last verdict

    @property
    def base_url(self) -> str: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def changing(self) -> bool: ...  # a start, stop, restart or swap holds the lock

    def exit_status(self) -> str | None: ...

    def restart_cooldown_left(self) -> float: ...

    async def restart(self, reason: str, *, hard: bool = False,
                      generation: int | None = None) -> None: ...

    def exclusive(self) -> AbstractAsyncContextManager[None]: ...

    async def start_standby(self, gguf: Path, lora: Path | None) -> Served: ...

    def switch_to(self, standby: Served) -> None: ...

    def hold_requests(self) -> None: ...

    def release_requests(self) -> None: ...

    async def relaunch(self, gguf: Path, lora: Path | None) -> None: ...

    async def drain(self, url: str) -> None: ...

