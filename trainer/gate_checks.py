"""The gate's checks that must not run in the trainer: reward functions and patterns.

A held-out item's check may come from self-play, where the model wrote it: a
``python`` reward function is untrusted code, and a ``regex`` is an untrusted
pattern (a backtracking one can run for hours, and Python's ``re`` cannot be
interrupted). So ``SandboxScorer`` runs both as practice runs them
(``core.practice.checks.judge``): in the sandbox, under the check timeout, each
answer in an empty workspace of its own, since the gate's answer is one reply
with no tool run behind it. A python check that wants files the agent would
have made scores its floor on both sides, which the paired comparison cancels.

A check that crashes, times out or cannot run (no sandbox) leaves the item
unscored on that side: the gate counts it and leaves it out, as it does for
any item not scored on both sides. ``exact`` and ``contains`` are string
comparisons and run here.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from core.config import Config
from core.practice.checks import judge
from core.practice.sets import Check, Task
from sandbox.paths import Workspace
from sandbox.process import Limits, Sandbox
from trainer.gate_items import score_check

logger = logging.getLogger("nightshift.gate")


class SandboxScorer:
    """``await scorer(check, answer)`` -> a score in [0, 1], or None: unscored."""

    def __init__(self, config: Config, sandbox: Sandbox | None = None) -> None:
        self.sandbox = sandbox or Sandbox(
            allow_unsandboxed=config.sandbox.allow_unsandboxed,
            limits=Limits(workspace_mb=config.sandbox.workspace_quota_mb))
        self.timeout_s = config.practice.check_timeout_s
        self.root = config.data_dir / "gate-checks"
        self.failures: list[str] = []  # why checks went unscored, for the night's log

    async def __call__(self, check: dict, answer: str) -> float | None:
        if "python" in check:
            code = check.get("code")
            if not isinstance(code, str) or not code.strip():
                return self._unscored(f"python check {check['python']!r} has no code")
            kind = Check("python", str(check["python"]), code)
        elif "regex" in check:
            # judge fullmatches; the gate's regex is found anywhere in the answer.
            kind = Check("regex", f"(?s:.*?)(?:{check['regex']})(?s:.*)")
        else:
            return score_check(check, answer)
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.root, ignore_cleanup_errors=True) as folder:
            verdict = await judge(Task("gate", "", kind, 0), answer, Workspace(Path(folder)),
                                  self.sandbox, self.timeout_s)
        return verdict.reward if verdict.judged else self._unscored(verdict.why)

    def _unscored(self, why: str) -> None:
        self.failures.append(why)
        logger.warning("gate check unscored: %s", why)
        return None
