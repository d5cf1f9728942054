"""A check run every few seconds for the bot's lifetime (the sleep schedule, self-play's
daily run, the night watch): one failed check is logged, never the end of the loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger("nightshift")


async def every(interval_s: Callable[[], float], check: Callable[[], Awaitable[object]],
                what: str) -> None:
    """Run ``check`` and sleep ``interval_s()`` seconds, until cancelled."""
    while True:
        try:
            await check()
        except asyncio.CancelledError:
            raise
        except Exception:  # the loop must outlive any one bad check
            logger.exception("%s failed", what)
        await asyncio.sleep(interval_s())
