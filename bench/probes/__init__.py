"""The probes of bench/reliability.py, one module per category.

Each module has ``async def run(tally, work, quick)``: it tries real attacks and
crashes against the real components (bwrap sandbox, SQLite store, llama.cpp
server, trainer, front ends) and records each outcome with ``tally.check``.
A probe that raises counts as failed, with its exception as the detail: an
attack that crashes the harness is not an attack that was refused.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Tally:
    """What one category tried, and what failed (a name and a detail per failure)."""

    tried: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # figures worth printing, not verdicts
    verbose: bool = False  # print every probe's verdict and detail as it comes


    def check(self, name: str, ok: bool, detail: Any = "") -> bool:
        self.tried += 1
        if self.verbose:
            print(f"  {'held ' if ok else 'FAILED'} {name}: {str(detail)[:300]}", file=sys.stderr)
        if not ok:
            self.failures.append(f"{name}: {str(detail)[:400]}")
        return ok

    async def probe(self, name: str, attempt: Callable[[], Awaitable[tuple[bool, Any]]]) -> bool:
        """Run ``attempt`` (returning (held, detail)); an exception is a failed probe."""
        try:
            held, detail = await attempt()
        except Exception as exc:  # noqa: BLE001 - the probe's verdict, not a harness bug
            tail = traceback.format_exc().strip().splitlines()[-3:]
            return self.check(name, False, f"raised {type(exc).__name__}: {exc} | {' / '.join(tail)}")
        return self.check(name, held, detail)
