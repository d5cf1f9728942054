"""A proposer's reply as a task, and the proposer's reward.

**Reading a proposal.** A small model rarely writes exactly the JSON asked
for, so ``parse_proposal`` is lenient about the wrapping and strict about the
content:

- the first JSON object anywhere in the reply (in a fenced block or bare
  text) that has a prompt; keys may be spelled ``prompt``/``task``/
  ``question``, ``reference``/``reference_answer``/``answer``/``solution``;
- the check as ``{"python": CODE}``, ``{"exact": TEXT}`` or
  ``{"regex": PATTERN}``, or as a string of code that defines ``reward``,
  or, failing those, a fenced Python block that defines ``reward``.

Anything missing is a ``ProposalError`` whose text is the observation the
proposer reads next: what was wrong and the format to use. The reply is the
model's, so it is read under limits (``MAX_REPLY_CHARS``, a bounded number
of decode attempts) and in a thread, never on the event loop; the check's
code is never compiled here (``ast`` on hostile code can exhaust the
stack): the sandbox runs it during validation (``bot.selfplay.round``).

**The proposer's reward** (``proposer_reward``, README "How it learns"): a
pure function of the solvers' mean reward, the target and validity, in [0, 1]::

    invalid proposal              -> 0
    valid, mean m, target t       -> FLOOR + (1 - FLOOR) * (1 - |m - t| / max(t, 1 - t))
    valid, no judged attempt      -> None (unjudged: the night excludes it)

It is 1 at the target and falls linearly to ``FLOOR`` (0.2) at the mean
farthest from it (with t = 0.5: every solver solves it, or none does). A
valid proposal always beats an invalid one, so fixing a broken check pays.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from core.practice.sets import Check, Task

FLOOR = 0.2  # a valid proposal's least reward; an invalid one gets 0
MAX_REPLY_CHARS = 20_000  # the part of a reply that is read
MAX_DECODES = 200  # JSON decode attempts per reply (one per "{")
MAX_CHECK_CHARS = 20_000
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)
_PROMPT_KEYS = ("prompt", "task", "question")
_REFERENCE_KEYS = ("reference", "reference_answer", "answer", "solution")
FORMAT = ('{"prompt": "the task, as a user would ask it", '
          '"check": {"python": "def reward(answer, workspace):\\n    return 1.0 if '
          'answer.strip() == \\"42\\" else 0.0"}, "reference": "42"}')


class ProposalError(ValueError):
    """A proposal cannot be used; the text says why and how to write it."""


@dataclass(frozen=True)
class Proposal:
    prompt: str
    check: Check  # kind exact/regex/python; a python check's code is in ``code``
    reference: str

    @property
    def id(self) -> str:
        """The task's id, from its content: the same task proposed twice is one task."""
        body = json.dumps([self.prompt, self.check.kind, self.check.code or self.check.value])
        return "sp-" + hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()[:12]

    def task(self) -> Task:
        return Task(self.id, self.prompt, self.check, 0)

    def set_check(self) -> dict:
        """The check as a practice-set line writes it (a python check names its file)."""
        if self.check.kind == "python":
            return {"python": f"selfplay/{self.id}.py"}
        return {self.check.kind: self.check.value}


def proposer_reward(mean: float | None, target: float, valid: bool) -> float | None:
    """The proposer's reward in [0, 1] (module docstring); None when no attempt was judged."""
    if not valid:
        return 0.0
    if mean is None:
        return None
    far = max(target, 1.0 - target)
    closeness = 1.0 - min(abs(mean - target) / far, 1.0)
    return FLOOR + (1.0 - FLOOR) * closeness


def parse_proposal(reply: str) -> Proposal:
    """The task in a proposer's reply; raises ProposalError with the observation to send."""
    text = (reply or "")[:MAX_REPLY_CHARS]
    item = _first_object(text)
    if item is None:
        raise ProposalError("I found no JSON object with a \"prompt\" in your reply. Answer "
                            f"with one JSON object like: {FORMAT}")
    prompt = _text(item, _PROMPT_KEYS)
    if not prompt:
        raise ProposalError("the task's \"prompt\" is empty or not a string; write the task "
                            "as a user would ask it")
    reference = _text(item, _REFERENCE_KEYS, strip=False)
    if reference is None or not reference.strip():
        raise ProposalError("the \"reference\" answer is missing or empty: give an answer "
                            "that passes your check, so that I can test the check")
    return Proposal(prompt, _check(item, text), reference.strip())


def _first_object(text: str) -> dict | None:
    """The first decodable JSON object with a prompt key: fenced blocks first, then bare."""
    decoder = json.JSONDecoder()
    bodies = [m.group(2) for m in _FENCE.finditer(text)] + [text]
    tries = 0
    for body in bodies:
        start = body.find("{")
        while start != -1 and tries < MAX_DECODES:
            tries += 1
            try:
                item, _ = decoder.raw_decode(body, start)
            except (ValueError, RecursionError):  # malformed, or nested past the stack
                item = None
            if isinstance(item, dict) and any(k in item for k in _PROMPT_KEYS):
                return item
            start = body.find("{", start + 1)
    return None


def _text(item: dict, keys: tuple[str, ...], strip: bool = True) -> str | None:
    for key in keys:
        value = item.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str):
            return value.strip() if strip else value
    return None


def _check(item: dict, text: str) -> Check:
    check = item.get("check", item.get("reward"))
    if isinstance(check, str) and "def reward" in check:
        check = {"python": check}
    if check is None:
        fenced = [m.group(2) for m in _FENCE.finditer(text) if "def reward" in m.group(2)]
        if fenced:
            check = {"python": fenced[0]}
    if not isinstance(check, dict) or len(check) != 1 \
            or next(iter(check)) not in ("python", "exact", "regex"):
        raise ProposalError("the \"check\" must be one of {\"python\": CODE defining "
                            "reward(answer, workspace) -> a number in [0, 1]}, {\"exact\": TEXT} "
                            f"or {{\"regex\": PATTERN}}, not {json.dumps(check)[:200]}")
    kind, value = next(iter(check.items()))
    if not isinstance(value, str) or not value.strip():
        raise ProposalError(f"the {kind} check's value must be a non-empty string")
    if len(value) > MAX_CHECK_CHARS:
        raise ProposalError(f"the {kind} check is longer than {MAX_CHECK_CHARS} characters; "
                            "keep it short")
    if kind == "python":
        if "def reward" not in value:
            raise ProposalError("the python check must define reward(answer, workspace) "
                                "returning a number in [0, 1]")
        return Check("python", "proposal.py", value)
    return Check(kind, value)
