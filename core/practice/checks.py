"""The checks that judge a practice attempt: exact, regex, python.

``judge`` returns a ``Verdict``: a reward in [0, 1], or None with the reason
the attempt is unjudged. Unjudged attempts are excluded from training, so a
broken check can never pass for a real 0 or 1:

- ``exact`` compares in the bot's process: a string comparison cannot hang.
- ``regex`` runs in the sandbox under a timeout: the pattern is the admin's,
  but the answer is the model's, and a backtracking pattern on an unlucky
  answer can run for hours; Python's ``re`` cannot be interrupted in a thread.
- ``python`` runs the set's reward function in the sandbox, in the attempt's
  workspace (``/workspace``, read-write, so it can inspect the files the agent
  made), under the same timeout and rlimits as the agent's own code.

Both sandboxed kinds run ``python3 -I`` (isolated: the workspace is not on
``sys.path``, so a file the agent left there cannot shadow ``json`` or
``re``) with the job on stdin. The result comes back as the last stdout line
that starts with a per-run random marker, so what the reward function prints
cannot pose as its result. Anything else (a crash, a timeout, no result line,
a bool, a string, NaN, a number outside [0, 1]) is unjudged, with the reason.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass

from core.practice.sets import Task
from sandbox.paths import Workspace
from sandbox.process import Sandbox, SandboxUnavailable

CHECK_TIMEOUT_S = 10.0

_RUNNER = r"""
import json, sys
job = json.loads(sys.stdin.read())
def report(**result):
    sys.stdout.write("\n" + job["marker"] + json.dumps(result) + "\n")
    sys.stdout.flush()
if job["kind"] == "regex":
    import re
    report(value=1.0 if re.fullmatch(job["pattern"], job["answer"]) else 0.0)
else:
    scope = {"__name__": "practice_check"}
    exec(compile(job["code"], job["filename"], "exec"), scope)
    value = scope["reward"](job["answer"], job["workspace"])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        report(error="reward() returned %s, not a number" % type(value).__name__)
    else:
        report(value=float(value))
"""


@dataclass(frozen=True)
class Verdict:
    reward: float | None  # None: unjudged, excluded from training
    why: str = ""  # for an unjudged attempt, what went wrong

    @property
    def judged(self) -> bool:
        return self.reward is not None


async def judge(task: Task, answer: str, workspace: Workspace, sandbox: Sandbox,
                timeout_s: float = CHECK_TIMEOUT_S) -> Verdict:
    """The verdict of ``task``'s check on a final ``answer`` and its ``workspace``."""
    answer = answer.strip()
    check = task.check
    if check.kind == "exact":
        return Verdict(1.0 if answer == check.value.strip() else 0.0)
    marker = f"@@practice-{secrets.token_hex(8)}@@ "
    job = {"kind": check.kind, "answer": answer, "marker": marker, "workspace": "/workspace"}
    if check.kind == "regex":
        job["pattern"] = check.value
    else:
        job.update(code=check.code, filename=check.value)
        if not sandbox.sandboxed:  # allowed unsandboxed mode: the workspace is a host path
            job["workspace"] = str(workspace.root)
    try:
        result = await sandbox.run(["python3", "-I", "-c", _RUNNER], workspace,
                                   stdin=json.dumps(job), timeout_s=timeout_s)
    except SandboxUnavailable as exc:
        return Verdict(None, f"the check cannot run: {exc}")
    if result.timed_out:
        return Verdict(None, f"the {check.kind} check timed out after {timeout_s:g} s")
    if not result.ok:
        tail = result.stderr.strip().splitlines()[-1:] or ["no error output"]
        return Verdict(None, f"the {check.kind} check crashed (exit {result.returncode}): "
                             f"{tail[0][:300]}")
    return _reported(result.stdout, marker)


def _reported(stdout: str, marker: str) -> Verdict:
    lines = [line for line in stdout.splitlines() if line.startswith(marker)]
    if not lines:
        return Verdict(None, "the check reported no result")
    try:
        result = json.loads(lines[-1][len(marker):])
    except ValueError:
        return Verdict(None, "the check's result line is not JSON")
    if "error" in result:
        return Verdict(None, str(result["error"])[:300])
    value = result.get("value")
    if not isinstance(value, float) or not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return Verdict(None, f"reward() returned {value!r}, not a number in [0, 1]")
    return Verdict(value)
