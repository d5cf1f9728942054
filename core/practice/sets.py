"""A practice set: a JSONL file of tasks, and its deterministic held-out split.

One task a line::

    {"id": "add-17-25", "prompt": "What is 17 + 25? Answer with only the number.",
     "check": {"exact": "42"}}

The check is exactly one of:

- ``{"exact": TEXT}``: the final answer, stripped of surrounding whitespace,
  equals TEXT (also stripped);
- ``{"regex": PATTERN}``: the stripped answer matches PATTERN as a whole
  (``re.fullmatch``; write ``.*`` around it to search);
- ``{"python": FILE}``: FILE (relative to the set's directory) defines
  ``reward(answer: str, workspace: str) -> float`` returning a number in
  [0, 1]; it runs in the sandbox (``core.practice.checks``).

A task may also give ``"reference"``: a right final answer (an exact check's
text is one already). When none of a task's attempts passes, the runner adds
the reference, once its check passes it, to the attempts as a demonstration
(``bot.practice.runner``): a skill the model never hits by chance is still
learnt, from the example. A task whose check reads the workspace can show the
tool calls that do it: ``"reference": {"calls": [{"name": "write_file",
"arguments": {"path": "a.txt", "content": "hi"}}], "answer": "I wrote a.txt."}``.
The calls are run through the real tools in a fresh workspace, and the check
must pass on their result before the example is kept.

Everything is checked when the set is read, so a bad file fails at once with
its line number and nothing runs: malformed JSON, unknown or missing keys, an
empty id or prompt, a duplicate id, a regex that does not compile, a python
check file that is missing, too large, not Python, or has no ``reward``.

**Held out.** A task is held out when the hash of its id falls in the first
``percent`` of 100 buckets. It depends on the id alone, so a task once held
out stays held out when tasks are added, removed or reordered, or the file is
renamed: the gate's items never leak into practice. The price is that a small
set may hold out fewer (or more) tasks than the share; the runner says how
many. This module imports only the standard library, so the trainer's gate
can call ``held_out_items`` itself.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_PERCENT = 20
MAX_SET_BYTES = 16 << 20
MAX_CHECK_BYTES = 256 << 10
MAX_ID_CHARS = 128
MAX_REFERENCE_CALLS = 8
KINDS = ("exact", "regex", "python")


class PracticeSetError(ValueError):
    """A practice set cannot be used; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class Check:
    kind: str  # one of KINDS
    value: str  # the expected text, the pattern, or the python file's path
    code: str = ""  # the python check's source, read once when the set is read


@dataclass(frozen=True)
class Task:
    id: str
    prompt: str
    check: Check
    line: int  # 1-based line in the set's file
    reference: str = ""  # a right final answer, if the set gives one (or the exact text)
    # Tool calls that do the task, before that answer: ((name, arguments), ...).
    calls: tuple[tuple[str, dict], ...] = ()


@dataclass(frozen=True)
class PracticeSet:
    name: str  # the file's stem, as events and groups name the set
    path: Path
    tasks: tuple[Task, ...]

    def split(self, percent: int = HELD_OUT_PERCENT) -> tuple[list[Task], list[Task]]:
        """(practised, held out), each in file order."""
        practised = [t for t in self.tasks if not is_held_out(t.id, percent)]
        held = [t for t in self.tasks if is_held_out(t.id, percent)]
        return practised, held


def is_held_out(task_id: str, percent: int = HELD_OUT_PERCENT) -> bool:
    bucket = int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:8], "big") % 100
    return bucket < percent


def held_out_items(path: Path | str, percent: int = HELD_OUT_PERCENT) -> list[Task]:
    """The tasks of the set at ``path`` that are never practised: the gate's items."""
    return load_set(path).split(percent)[1]


def load_set(path: Path | str) -> PracticeSet:
    """Read and check a whole set; raises PracticeSetError naming the line."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise PracticeSetError(f"cannot read the practice set {path}: {exc.strerror}") from None
    if size > MAX_SET_BYTES:
        raise PracticeSetError(f"{path} is {size} bytes; a practice set may have at most "
                               f"{MAX_SET_BYTES} bytes. Split it into several files.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PracticeSetError(f"{path} is not UTF-8 text (byte {exc.start})") from None
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        task = _task(path, number, line)
        if task.id in seen:
            raise PracticeSetError(f"{path}:{number}: the id {task.id!r} is already used on "
                                   f"line {seen[task.id]}; ids must be unique in a set")
        seen[task.id] = number
        tasks.append(task)
    if not tasks:
        raise PracticeSetError(f"{path} has no tasks; write one JSON object a line: "
                               '{"id": ..., "prompt": ..., "check": {"exact": ...}}')
    return PracticeSet(_name(path), path, tuple(tasks))


def _name(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", path.stem).strip("-") or "set"


def _task(path: Path, number: int, line: str) -> Task:
    where = f"{path}:{number}"
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PracticeSetError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") \
            from None
    if not isinstance(item, dict):
        raise PracticeSetError(f"{where}: a task must be a JSON object, not "
                               f"{type(item).__name__}")
    extra = sorted(set(item) - {"id", "prompt", "check", "reference"})
    missing = [k for k in ("id", "prompt", "check") if k not in item]
    if extra or missing:
        raise PracticeSetError(f"{where}: a task has the keys id, prompt and check, and "
                               "optionally reference "
                               f"(missing: {missing or 'none'}; unknown: {extra or 'none'})")
    task_id, prompt = item["id"], item["prompt"]
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    if not isinstance(task_id, str) or not task_id.strip() or len(task_id) > MAX_ID_CHARS:
        raise PracticeSetError(f"{where}: id must be a non-empty string of at most "
                               f"{MAX_ID_CHARS} characters, not {task_id!r}")
    if not isinstance(prompt, str) or not prompt.strip():
        raise PracticeSetError(f"{where}: prompt must be a non-empty string")
    check = _check(path, where, item["check"])
    reference = item.get("reference", check.value if check.kind == "exact" else "")
    calls: tuple[tuple[str, dict], ...] = ()
    if isinstance(reference, dict):
        reference, calls = _reference_calls(where, reference)
    if not isinstance(reference, str) or (not reference.strip() and "reference" in item):
        raise PracticeSetError(f"{where}: reference must be a non-empty string, or "
                               '{"calls": [{"name": TOOL, "arguments": {...}}], "answer": TEXT}')
    return Task(task_id, prompt, check, number, reference.strip(), calls)


def _reference_calls(where: str, reference: dict) -> tuple[str, tuple[tuple[str, dict], ...]]:
    """(the answer, the calls) of a reference that shows tool calls."""
    shape = ('{"calls": [{"name": TOOL, "arguments": {...}}, ...], "answer": TEXT} with 1 to '
             f"{MAX_REFERENCE_CALLS} calls")
    calls, answer = reference.get("calls"), reference.get("answer")
    if (set(reference) != {"calls", "answer"} or not isinstance(calls, list)
            or not 1 <= len(calls) <= MAX_REFERENCE_CALLS
            or not isinstance(answer, str) or not answer.strip()):
        raise PracticeSetError(f"{where}: a reference with tool calls is {shape}")
    out = []
    for i, call in enumerate(calls, 1):
        if (not isinstance(call, dict) or set(call) != {"name", "arguments"}
                or not isinstance(call["name"], str) or not call["name"].strip()
                or not isinstance(call["arguments"], dict)):
            raise PracticeSetError(f"{where}: reference call {i} must be "
                                   '{"name": TOOL, "arguments": {...}}')
        out.append((call["name"], call["arguments"]))
    return answer, tuple(out)


def _check(path: Path, where: str, check: object) -> Check:
    if not isinstance(check, dict) or len(check) != 1 or next(iter(check)) not in KINDS:
        raise PracticeSetError(f"{where}: check must be one of {{\"exact\": TEXT}}, "
                               f"{{\"regex\": PATTERN}} or {{\"python\": FILE}}, not "
                               f"{json.dumps(check)[:200]}")
    kind, value = next(iter(check.items()))
    if not isinstance(value, str) or (kind != "exact" and not value):
        raise PracticeSetError(f"{where}: the {kind} check's value must be a non-empty string")
    if kind == "regex":
        try:
            re.compile(value)
        except re.error as exc:
            raise PracticeSetError(f"{where}: the regex {value!r} does not compile: {exc}") \
                from None
    if kind == "python":
        file = (path.parent / value).resolve()
        return Check(kind, str(file), _check_code(where, file))
    return Check(kind, value)


def _check_code(where: str, file: Path) -> str:
    """The python check's source, once it is known to define ``reward``."""
    try:
        if file.stat().st_size > MAX_CHECK_BYTES:
            raise PracticeSetError(f"{where}: the python check {file} is larger than "
                                   f"{MAX_CHECK_BYTES} bytes")
        code = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise PracticeSetError(f"{where}: cannot read the python check {file}: {why}") from None
    try:
        tree = ast.parse(code, str(file))
    except SyntaxError as exc:
        raise PracticeSetError(f"{where}: the python check {file} is not valid Python "
                               f"(line {exc.lineno}: {exc.msg})") from None
    if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "reward"
               for n in tree.body):
        raise PracticeSetError(f"{where}: the python check {file} must define "
                               "reward(answer, workspace) returning a number in [0, 1]")
    return code
