"""The registry: schemas from hints and docstrings, argument checks, and errors as observations."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Literal

import pytest

from sandbox.paths import Workspace
from tools import MAX_OUTPUT_CHARS, Registry, ToolContext, ToolError, ToolResult, default_registry, tool


@tool
def greet(ctx: ToolContext, name: str, times: int = 1, loud: bool = False,
          tone: Literal["warm", "dry"] = "warm", tags: list[str] | None = None,
          weight: float | None = None) -> str:
    """Greet someone.

    Longer text that stays in the description.

    Args:
        name: Who to greet.
        times: How often,
            wrapped onto a second line.
        loud: Shout or not.
        tone: The tone.
        tags: Labels to add.
        weight: Any number.
    """
    thread = threading.current_thread().name
    return f"{'HI' if loud else 'hi'} {name} x{times} {tone} {tags or []} {weight} {thread}"


@tool
async def fails(ctx: ToolContext, kind: str) -> str:
    """Fail in the way asked.

    Args:
        kind: refuse, oserror, bug, or huge.
    """
    if kind == "refuse":
        raise ToolError("no, because reasons")
    if kind == "oserror":
        raise PermissionError(13, "Permission denied", str(ctx.workspace.root / "secret.txt"))
    if kind == "bug":
        raise TypeError("'NoneType' object is not subscriptable")
    if kind == "meta":
        return ToolResult(True, "with meta", {"files": ["a.png"]})
    return "x" * (MAX_OUTPUT_CHARS + 500)


@pytest.fixture
def registry() -> Registry:
    registry = Registry()
    registry.register(greet)
    registry.register(fails)
    return registry


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext.open("test", Workspace(tmp_path / "ws"), tmp_path / "state", embedder="e",
                            vision=True)


def test_schema_comes_from_hints_and_the_args_section():
    function = greet.schema()["function"]
    assert function["name"] == "greet"
    assert function["description"] == "Greet someone.\n\nLonger text that stays in the description."
    props = function["parameters"]["properties"]
    assert props["name"] == {"type": "string", "description": "Who to greet."}
    assert props["times"] == {"type": "integer", "description": "How often, wrapped onto a second line.",
                              "default": 1}
    assert props["loud"]["type"] == "boolean"
    assert props["tone"]["enum"] == ["warm", "dry"]
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "description": "Labels to add."}
    assert props["weight"]["type"] == "number" and "default" not in props["weight"]
    assert function["parameters"]["required"] == ["name"]
    assert "ctx" not in props


def test_decoration_refuses_undocumented_untyped_or_unsupported_parameters():
    with pytest.raises(TypeError, match="not documented"):
        @tool
        def undocumented(ctx: ToolContext, x: int) -> str:
            """Does things."""
    with pytest.raises(TypeError, match="no type hint"):
        @tool
        def untyped(ctx: ToolContext, x) -> str:
            """Does things.

            Args:
                x: A thing.
            """
    with pytest.raises(TypeError, match="unsupported"):
        @tool
        def dict_param(ctx: ToolContext, x: dict) -> str:
            """Does things.

            Args:
                x: A thing.
            """
    with pytest.raises(TypeError, match="first parameter must be ctx"):
        @tool
        def no_ctx(x: int) -> str:
            """Does things.

            Args:
                x: A thing.
            """


async def test_call_validates_and_runs_sync_tools_off_the_event_loop(registry, ctx):
    result = await registry.call("greet", '{"name": "Ada", "times": "3", "tags": ["a"], "weight": 2}', ctx)
    assert result.ok
    assert result.output.startswith("hi Ada x3 warm ['a'] 2.0 ")
    assert threading.current_thread().name not in result.output  # ran in a worker thread
    assert result.meta["tool"] == "greet" and result.meta["ms"] >= 0


async def test_model_mistakes_come_back_as_clear_errors(registry, ctx):
    unknown = await registry.call("gret", {}, ctx)
    assert not unknown.ok and unknown.meta["error"] == "unknown_tool"
    assert "the tools are: greet, fails" in unknown.output
    bad_json = await registry.call("greet", '{"name": "Ada",', ctx)
    assert not bad_json.ok and "not valid JSON" in bad_json.output
    missing = await registry.call("greet", {}, ctx)
    assert "missing required argument 'name'" in missing.output and "greet(name: string" in missing.output
    extra = await registry.call("greet", {"name": "a", "color": "red"}, ctx)
    assert "no argument 'color'" in extra.output and "name, times, loud" in extra.output
    mistyped = await registry.call("greet", {"name": "a", "times": "often"}, ctx)
    assert "argument 'times' must be an integer; got string \"often\"" in mistyped.output
    choice = await registry.call("greet", {"name": "a", "tone": "cold"}, ctx)
    assert 'one of "warm", "dry"; got string "cold"' in choice.output
    boolean = await registry.call("greet", {"name": "a", "loud": 1}, ctx)
    assert "'loud' must be true or false" in boolean.output
    assert all(r.meta["error"] == "arguments" for r in (bad_json, missing, extra, mistyped, choice, boolean))


async def test_tool_refusals_and_os_errors_are_observations_without_host_paths(registry, ctx):
    refused = await registry.call("fails", {"kind": "refuse"}, ctx)
    assert refused == ToolResult(False, "fails: no, because reasons", refused.meta)
    os_error = await registry.call("fails", {"kind": "oserror"}, ctx)
    assert not os_error.ok and os_error.output == "fails: Permission denied: secret.txt"


async def test_a_bug_in_a_tool_is_logged_and_returned_not_raised(registry, ctx, caplog):
    with caplog.at_level(logging.ERROR, logger="nightshift.tools"):
        result = await registry.call("fails", {"kind": "bug"}, ctx)
    assert not result.ok and result.meta["error"] == "internal"
    assert "TypeError" in result.output and "not your mistake" in result.output
    assert "tool fails failed" in caplog.text


async def test_outputs_are_capped_and_tool_results_pass_through(registry, ctx):
    huge = await registry.call("fails", {"kind": "huge"}, ctx)
    assert len(huge.output) < MAX_OUTPUT_CHARS + 100 and "500 more characters cut" in huge.output
    meta = await registry.call("fails", {"kind": "meta"}, ctx)
    assert meta.ok and meta.meta["files"] == ["a.png"]


async def test_cancellation_propagates(ctx):
    @tool
    async def slow(ctx: ToolContext) -> str:
        """Sleep for a long time."""
        await asyncio.sleep(60)
        return "done"

    registry = Registry()
    registry.register(slow)
    task = asyncio.create_task(registry.call("slow", {}, ctx))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_registering_a_name_twice_is_a_harness_bug(registry):
    with pytest.raises(ValueError, match="twice"):
        registry.register(greet)


def test_default_registry_is_fresh_each_time_and_holds_every_module(ctx):
    first, second = default_registry(), default_registry()
    assert first is not second and first.names() == second.names()
    for name in ("read_file", "edit_file", "grep", "outline", "undo", "redo", "fill_recipe", "update_sys"):
        assert name in first.names()
    assert len(first.schemas()) == len(first.names())


def test_tool_context_open_builds_the_journal_and_keeps_services(ctx, tmp_path):
    assert ctx.journal.state_dir == (tmp_path / "state").resolve()
    assert ctx.embedder == "e" and ctx.services.vision is True and ctx.services.notes is None
    assert ctx.send_file is None


def test_an_unknown_tool_service_is_refused_by_name(tmp_path):
    """Services are typed fields, not a bag: a misspelt one fails where it is given."""
    with pytest.raises(TypeError, match="unknown tool service.* noets; the services are sandbox"):
        ToolContext.open("t", Workspace(tmp_path / "ws"), tmp_path / "state", noets=object())


def test_each_channel_gets_its_own_copy_of_the_shared_services(tmp_path):
    from tools import Services

    shared = Services(vision=True)
    one = ToolContext.open("a", Workspace(tmp_path / "a"), tmp_path / "sa", shared, outbox=[])
    two = ToolContext.open("b", Workspace(tmp_path / "b"), tmp_path / "sb", shared, outbox=[])
    one.services.jobs = list
    assert two.services.jobs is None and shared.jobs is None
    assert one.services.outbox is not two.services.outbox and one.services.vision


RELEASE = threading.Event()


@tool
def hangs(ctx: ToolContext) -> str:
    """Block until the test lets go (a host-side call that never returns, as a glob did)."""
    RELEASE.wait(30)
    return "late"


@tool
def times_out(ctx: ToolContext) -> str:
    """Raise the tool's own TimeoutError (a socket's, say): not the registry's deadline."""
    raise TimeoutError("the remote end did not answer")


async def test_a_sync_tool_past_its_deadline_ends_with_an_error_and_the_turn_goes_on(
        ctx, tmp_path):
    """A stuck call holds its own slot and its channel: the turn gets an error, that
    channel's next sync call waits for it (never racing it on the journal), other
    channels and the loop's executor go on (issue 40)."""
    from tools.host_calls import HostCalls

    RELEASE.clear()
    registry = Registry(HostCalls(threads=2, deadline_s=0.3))
    for t in (hangs, greet, times_out):
        registry.register(t)
    other = ToolContext.open("other", Workspace(tmp_path / "other"), tmp_path / "other-state")
    try:
        first = await registry.call("hangs", {}, ctx)
        assert not first.ok and first.meta["error"] == "deadline"
        assert "did not finish within 0.3 s" in first.output and "turn goes on" in first.output
        same = await registry.call("greet", {"name": "x"}, ctx)  # waits for the stuck one
        assert not same.ok and same.meta["error"] == "deadline"
        elsewhere = await registry.call("greet", {"name": "y"}, other)
        assert elsewhere.ok and elsewhere.output.startswith("hi y")
        assert await asyncio.to_thread(lambda: "free") == "free"  # the bot's executor
        own = await registry.call("times_out", {}, other)
        assert not own.ok and own.meta["error"] == "refused" and "did not answer" in own.output
    finally:
        RELEASE.set()
    for _ in range(100):  # the abandoned call ends; the channel's next call runs
        done = await registry.call("greet", {"name": "x"}, ctx)
        if done.ok:
            break
    assert done.ok and done.output.startswith("hi x x1") and "tool greet" in done.output
