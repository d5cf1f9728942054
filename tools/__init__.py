"""The tool registry: a tool is a typed function plus its docstring.

``@tool`` reads a function's type hints and the ``Args:`` section of its
Google-style docstring and builds the OpenAI function schema from them, so
the schema the model sees and the checks its arguments go through cannot
drift apart. The first parameter is always ``ctx: ToolContext``; it is the
harness's, not the model's, and stays out of the schema.

``Registry.call`` never raises for the model's mistakes. Invalid JSON, an
unknown tool, a missing, extra or mistyped argument, a path outside the
workspace and any ``ValueError``/``OSError`` from the tool come back as
``ToolResult(ok=False, output=<what to do about it>)``. A bug in a tool
(any other exception) is logged and comes back as an error too, marked as
the harness's fault, so one broken tool never ends a turn.

Adding a module of tools is one line in ``TOOL_MODULES``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_type_hints

from tools.host_calls import HostCalls, HostCallTimeout
from tools.schema import (  # noqa: F401 - ToolError is re-exported
    ArgumentError, ToolError, check_value, is_optional, json_type, parse_docstring, type_word,
)

if TYPE_CHECKING:
    from sandbox.disk_budget import DiskBudget
    from sandbox.paths import Workspace
    from sandbox.process import Sandbox
    from tools.filelocks import FileLocks
    from tools.image_cache import ImageCache
    from tools.journal import Journal

logger = logging.getLogger("nightshift.tools")

# Modules whose @tool functions make up default_registry(), in schema order.
TOOL_MODULES = (
    "tools.files",
    "tools.search",
    "tools.history",
    "tools.recipes",
    "tools.system",
    "tools.notes",
    "tools.media",
    "tools.outbox",
    "tools.health",
    "tools.python_jobs",
    "tools.git",
    "tools.board",
)

# A safety net over the tools' own bounds: one observation must not flood the context.
MAX_OUTPUT_CHARS = 16_000


@dataclass
class ToolResult:
    ok: bool
    output: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Services:
    """What the bot lends the tools beyond a channel's workspace, one typed field each;
    a field left at its default means the bot runs without that service. The shared
    ones (the sandbox, notes, the board, the locks, the job slots) are one object for
    every channel; ``jobs_runner``, ``jobs`` and ``outbox`` are the channel's own."""

    sandbox: Sandbox | None = None  # where code runs (tools.programs makes one if None)
    notes: Any = None  # tools.notes.NoteStore: the notes of every channel
    shared_notes_channels: frozenset[str] = frozenset()  # channels that see shared notes
    board: Any = None  # tools.board.Board: the swarms' shared board
    file_locks: FileLocks | None = None  # swarm members writing one workspace
    job_slots: Any = None  # tools.jobs.JobSlots: background jobs per channel and in all
    jobs_runner: Any = None  # tools.jobs.JobRunner: this channel's (python_jobs.job_runner)
    jobs: Callable[[], list[dict]] | None = None  # this channel's jobs, for the health tool
    vision: bool = False  # the model sees images attached to a message
    # Where viewed images are kept, by hash: a bounded ImageCache, or a plain folder.
    image_cache: ImageCache | Path | None = None
    workspace_quota_bytes: int | None = None  # the journal refuses writes past it
    disk: DiskBudget | None = None  # the data folder's budget and shares, for every write
    outbox: list[str] | None = None  # files to send with this turn's reply


@dataclass
class ToolContext:
    """What a tool may touch: one channel's workspace, journal and private state.

    ``state_dir`` lies outside the workspace, so nothing the agent runs can
    rewrite its own journal or system-prompt section behind the tools' back.
    Sending a file, a status line and the embedder are fields of their own; every
    other service the bot lends is a typed field of ``services``.
    """

    channel: str
    workspace: Workspace
    journal: Journal
    state_dir: Path
    send_file: Callable[..., Any] | None = None
    status: Callable[..., Any] | None = None
    embedder: Any = None
    services: Services = field(default_factory=Services)

    @classmethod
    def open(cls, channel: str, workspace: Workspace, state_dir: Path,
             services: Services | None = None, *, send_file: Callable[..., Any] | None = None,
             status: Callable[..., Any] | None = None, embedder: Any = None,
             **named: Any) -> ToolContext:
        """A context with the channel's journal loaded from ``state_dir``. ``named``
        sets fields of ``services`` (a copy: a channel's own fields stay its own); an
        unknown name is a TypeError that says which."""
        from tools.journal import Journal

        unknown = sorted(set(named) - {f.name for f in fields(Services)})
        if unknown:
            raise TypeError(f"unknown tool service(s) {', '.join(unknown)}; "
                            f"the services are {', '.join(f.name for f in fields(Services))}")
        services = replace(services or Services(), **named)
        state_dir = Path(state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        quota = services.workspace_quota_bytes
        if services.disk is None:
            journal = Journal(state_dir, workspace.root, quota_bytes=quota, history_bytes=quota)
        else:  # every write also answers to the data folder's budget
            from tools.budgeted_journal import BudgetedJournal

            journal = BudgetedJournal(state_dir, workspace.root, budget=services.disk,
                                      channel=channel, quota_bytes=quota, history_bytes=quota)
        return cls(channel, workspace, journal, state_dir, send_file, status, embedder, services)


@dataclass(frozen=True)
class Param:
    name: str
    hint: Any
    description: str
    required: bool
    default: Any = None


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: tuple[Param, ...]
    fn: Callable[..., Any]
    is_async: bool

    def __call__(self, ctx: ToolContext, **kwargs: Any) -> Any:
        return self.fn(ctx, **kwargs)

    def schema(self) -> dict:
        properties = {}
        for p in self.params:
            prop = {**json_type(p.hint), "description": p.description}
            if not p.required and p.default is not None:
                prop["default"] = p.default
            properties[p.name] = prop
        parameters = {
            "type": "object",
            "properties": properties,
            "required": [p.name for p in self.params if p.required],
            "additionalProperties": False,
        }
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": parameters}}

    def usage(self) -> str:
        """The call's shape in one line, for error messages: ``read_file(path, offset?, limit?)``."""
        parts = [f"{p.name}{'' if p.required else '?'}: {type_word(p.hint)}" for p in self.params]
        return f"{self.name}({', '.join(parts)})"

    def bind(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments to call with, checked against the hints; raises ArgumentError."""
        known = {p.name: p for p in self.params}
        extra = sorted(set(arguments) - set(known))
        if extra:
            names = ", ".join(known) or "none"
            raise ArgumentError(f"{self.name} has no argument {', '.join(map(repr, extra))}; "
                                f"its arguments are: {names}. Call it as {self.usage()}.")
        missing = [p.name for p in self.params if p.required and p.name not in arguments]
        if missing:
            raise ArgumentError(f"{self.name} is missing required argument "
                                f"{', '.join(map(repr, missing))}. Call it as {self.usage()}.")
        kwargs = {}
        for name, value in arguments.items():
            try:
                kwargs[name] = check_value(value, known[name].hint)
            except ArgumentError as exc:
                raise ArgumentError(f"{self.name}: argument {name!r} must be {exc}. "
                                    f"Call it as {self.usage()}.") from None
        return kwargs


def tool(fn: Callable[..., Any]) -> Tool:
    """Make ``fn`` a Tool; raises TypeError at import time for an undocumented or untyped parameter."""
    description, arg_docs = parse_docstring(fn)
    if not description:
        raise TypeError(f"tool {fn.__name__} has no docstring description")
    hints = get_type_hints(fn)
    signature = inspect.signature(fn)
    parameters = list(signature.parameters.values())
    if not parameters or parameters[0].name != "ctx":
        raise TypeError(f"tool {fn.__name__}: the first parameter must be ctx: ToolContext")
    params = []
    for p in parameters[1:]:
        if p.name not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter {p.name!r} has no type hint")
        if p.name not in arg_docs:
            raise TypeError(f"tool {fn.__name__}: parameter {p.name!r} is not documented under Args:")
        json_type(hints[p.name])  # raises for unsupported hints
        required = p.default is inspect.Parameter.empty
        if required and is_optional(hints[p.name]):
            raise TypeError(f"tool {fn.__name__}: optional parameter {p.name!r} needs a default")
        params.append(Param(p.name, hints[p.name], arg_docs[p.name], required,
                            None if required else p.default))
    stray = set(arg_docs) - {p.name for p in params}
    if stray:
        raise TypeError(f"tool {fn.__name__}: Args documents unknown parameters {sorted(stray)}")
    return Tool(fn.__name__, description, tuple(params), fn, inspect.iscoroutinefunction(fn))


class Registry:
    """Every tool the agent may call, by name."""

    def __init__(self, host: HostCalls | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        self._schemas: list[dict] | None = None
        # Sync tools run there: bounded threads of their own, a deadline per call.
        self.host = host or HostCalls()

    def register(self, t: Tool) -> None:
        if t.name in self._tools:
            raise ValueError(f"tool {t.name!r} is registered twice")
        self._tools[t.name] = t
        self._schemas = None

    def register_module(self, module: types.ModuleType) -> None:
        """Register the module's own tools (not ones it imported), in definition order."""
        for value in vars(module).values():
            if isinstance(value, Tool) and value.fn.__module__ == module.__name__:
                self.register(value)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict]:
        """The tools' JSON schemas, built once: the agent asks several times per turn.
        Callers must not change the list."""
        if self._schemas is None:
            self._schemas = [t.schema() for t in self._tools.values()]
        return self._schemas

    async def call(self, name: str, arguments: str | dict | None, ctx: ToolContext) -> ToolResult:
        start = time.perf_counter()
        result = await self._call(name, arguments, ctx)
        result.meta.setdefault("tool", name)
        result.meta["ms"] = round((time.perf_counter() - start) * 1000, 3)
        if len(result.output) > MAX_OUTPUT_CHARS:
            cut = len(result.output) - MAX_OUTPUT_CHARS
            result.output = result.output[:MAX_OUTPUT_CHARS] + f"\n[... {cut} more characters cut]"
        return result

    async def _call(self, name: str, arguments: str | dict | None, ctx: ToolContext) -> ToolResult:
        t = self._tools.get(name)
        if t is None:
            return _error("unknown_tool", f"there is no tool {name!r}; the tools are: "
                                          f"{', '.join(self._tools)}.")
        try:
            kwargs = t.bind(_parse_arguments(arguments, t))
        except ArgumentError as exc:
            return _error("arguments", str(exc))
        try:
            if t.is_async:
                output = await t.fn(ctx, **kwargs)
            else:
                output = await self.host.run(ctx.channel, t.fn, ctx, **kwargs)
        except asyncio.CancelledError:
            raise
        except HostCallTimeout as exc:
            return _error("deadline", f"{name}: {exc}, so it was abandoned and your turn goes "
                                      "on; ask for less (a narrower path or pattern)")
        except OSError as exc:
            return _error("refused", f"{name}: {_describe_os_error(exc, ctx)}")
        except ValueError as exc:  # ToolError, PathEscape, JournalConflict, ...
            return _error("refused", f"{name}: {exc}")
        except Exception as exc:
            logger.exception("tool %s failed with arguments %r", name, kwargs)
            return _error("internal", f"{name} failed inside the harness ({type(exc).__name__}: "
                                      f"{exc}). This is not your mistake; try another way.")
        if isinstance(output, ToolResult):
            return output
        return ToolResult(True, str(output))


def default_registry() -> Registry:
    """A fresh Registry holding every tool of TOOL_MODULES."""
    registry = Registry()
    for module_name in TOOL_MODULES:
        registry.register_module(importlib.import_module(module_name))
    return registry


def _error(kind: str, message: str) -> ToolResult:
    return ToolResult(False, message, {"error": kind})


def _parse_arguments(arguments: str | dict | None, t: Tool) -> dict:
    if arguments is None:
        return {}
    if isinstance(arguments, str):
        if not arguments.strip():  # small models send "" for tools without arguments
            return {}
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise ArgumentError(f"the arguments for {t.name} are not valid JSON ({exc.msg} at "
                                f"character {exc.pos}); send one JSON object, e.g. for "
                                f"{t.usage()}.") from None
    if not isinstance(arguments, dict):
        raise ArgumentError(f"the arguments for {t.name} must be a JSON object, not "
                            f"{type(arguments).__name__}; call it as {t.usage()}.")
    return arguments


def _describe_os_error(exc: OSError, ctx: ToolContext) -> str:
    """The error without host paths: the model knows its files by workspace-relative names."""
    reason = exc.strerror or str(exc)
    if not exc.filename:
        return reason
    try:
        where = ctx.workspace.relative(Path(exc.filename))
    except (ValueError, AttributeError):
        where = Path(str(exc.filename)).name
    return f"{reason}: {where}"
