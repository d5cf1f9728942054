"""The swarm board and /swarm start: members exchange posts, outsiders are refused,
a started swarm's members work on its task through real agent turns."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from bot.commands import Caller, run_command
from core.config.routines import Swarm, SwarmsConfig
from sandbox.paths import Workspace
from tests.discord_helpers import make_config, start_runtime
from tests.scripted import ScriptedLLM, call, say
from tools import Registry, ToolContext
import tools.board
from tools.board import Board
from tools.filelocks import FileLocks
import tools.files

REGISTRY = Registry()
REGISTRY.register_module(tools.board)
REGISTRY.register_module(tools.files)
ADMIN = Caller(0, (), "s1", "console", local=True)


def context(tmp_path: Path, channel: str, **services) -> ToolContext:
    return ToolContext.open(channel, Workspace(tmp_path / f"ws-{channel}"),
                            tmp_path / f"state-{channel}", **services)


async def tool(ctx: ToolContext, name: str, **arguments) -> tuple[bool, str]:
    result = await REGISTRY.call(name, arguments, ctx)
    return result.ok, result.output


@pytest.fixture
def board(tmp_path: Path) -> Board:
    return Board(tmp_path / "board.db", {"team": ["a", "b"], "other": ["c", "d"]})


async def test_two_swarm_channels_exchange_posts_and_an_outsider_cannot_read_them(tmp_path,
                                                                                  board):
    a, b = context(tmp_path, "a", board=board), context(tmp_path, "b", board=board)
    outsider = context(tmp_path, "x", board=board)
    assert await tool(a, "board_post", topic="claims", text="I take the parser") == \
        (True, "posted #1 on 'claims'")
    ok, seen_by_b = await tool(b, "board_read")
    assert ok and "#1 [claims] a" in seen_by_b and "I take the parser" in seen_by_b
    assert (await tool(b, "board_post", topic="results", text="tests pass"))[0]
    ok, seen_by_a = await tool(a, "board_read", topic="results")
    assert ok and "tests pass" in seen_by_a and "parser" not in seen_by_a

    for name, arguments in [("board_read", {}), ("board_post", {"topic": "t", "text": "hi"})]:
        ok, output = await tool(outsider, name, **arguments)
        assert not ok and "not a member of any swarm" in output
    assert [p["channel"] for p in board.read("a")] == ["a", "b"]  # the outsider posted nothing


async def test_another_swarm_sees_none_of_the_posts(tmp_path, board):
    a, c = context(tmp_path, "a", board=board), context(tmp_path, "c", board=board)
    await tool(a, "board_post", topic="claims", text="secret plan")
    ok, output = await tool(c, "board_read")
    assert ok and output == "no posts after #0"


async def test_since_returns_only_newer_posts_and_posts_survive_a_restart(tmp_path, board):
    a = context(tmp_path, "a", board=board)
    for i in range(3):
        await tool(a, "board_post", topic="log", text=f"step {i}")
    reopened = Board(tmp_path / "board.db", {"team": ["a", "b"]})
    b = context(tmp_path, "b", board=reopened)
    ok, output = await tool(b, "board_read", topic="log", since=2)
    assert ok and "step 2" in output and "step 1" not in output and "last id 3" in output


async def test_bad_posts_are_refused_with_the_fix(tmp_path, board):
    a = context(tmp_path, "a", board=board)
    assert "topic must be" in (await tool(a, "board_post", topic=" ", text="x"))[1]
    assert "text is empty" in (await tool(a, "board_post", topic="t", text="  "))[1]
    assert "the limit is 4000" in (await tool(a, "board_post", topic="t", text="x" * 4001))[1]
    assert "since must be" in (await tool(a, "board_read", since=-1))[1]
    nothing = context(tmp_path, "a")  # no board configured at all
    assert "no swarms are configured" in (await tool(nothing, "board_read"))[1]


def test_a_started_task_is_in_members_prompt_sections_only_until_stopped(tmp_path, board):
    with pytest.raises(ValueError, match="no swarm 'nope'; the swarms are: team, other"):
        board.start("nope", "x")
    board.start("team", "write a haiku")
    section = board.prompt_section("a")
    assert "write a haiku" in section and "board_read" in section and "'claims'" in section
    assert "with the channels b" in section
    assert board.prompt_section("c") == "" and board.prompt_section("x") == ""
    assert Board(tmp_path / "board.db", {"team": ["a", "b"]}).tasks == {"team": "write a haiku"}
    board.stop("team")
    assert board.prompt_section("a") == ""


def test_a_channel_in_two_swarms_is_a_config_error():
    with pytest.raises(ValueError, match="channel 'b' is in the swarms 'one' and 'two'"):
        SwarmsConfig(teams=[Swarm(name="one", channels=["a", "b"]),
                            Swarm(name="two", channels=["b", "c"])])


def test_a_shared_workspace_locks_each_file_so_concurrent_edits_are_all_kept(tmp_path):
    locks = FileLocks()
    shared = Workspace(tmp_path / "shared")
    members = [ToolContext.open(f"m{i}", shared, tmp_path / f"state-{i}", file_locks=locks)
               for i in range(4)]
    (shared.root / "log.txt").write_text("")

    def append(ctx: ToolContext, n: int) -> None:
        for i in range(n):  # a read-modify-write; without the lock, appends get lost
            asyncio.run(REGISTRY.call("edit_file", {
                "path": "log.txt", "mode": "insert", "after": 0, "text": f"{ctx.channel}-{i}\n"},
                ctx))

    threads = [threading.Thread(target=append, args=(ctx, 10)) for ctx in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = (shared.root / "log.txt").read_text().splitlines()
    assert sorted(lines) == sorted(f"m{i}-{j}" for i in range(4) for j in range(10))


def swarm_script(messages: list[dict], kwargs: dict):
    """Each member claims on the board, reads it, and answers; by its own channel name."""
    me = "s1" if "with the channels s2" in messages[0]["content"] else "s2"
    done = [m for m in messages if m["role"] == "tool"]
    if not done:
        return call("board_post", {"topic": "claims", "text": f"{me} takes part {me[-1]}"})
    if len(done) == 1:
        return call("board_read", {"topic": "claims"})
    return say(f"{me} did its part")


async def test_swarm_start_runs_each_member_as_a_real_turn_and_they_see_each_others_claims(
        tmp_path):
    config = make_config(tmp_path)
    config.swarms.teams = [Swarm(name="team", channels=["s1", "s2"], shared_workspace=True)]
    llm = ScriptedLLM(swarm_script)
    rt = await start_runtime(config, llm)
    said: list[tuple[str, str]] = []

    async def announce(channel: str, text: str) -> None:
        said.append((channel, text))

    rt.announcers.append(announce)
    try:
        answer = await run_command(rt, ADMIN, "swarm start", swarm="team", task="split the work")
        assert answer.text.startswith("Swarm team started on board post #1: 2 of 2 channels")
        assert rt.rounds.names() == ["swarm:team"]  # a scheduled night waits for it
        for _ in range(200):
            if len(said) == 2 and not rt.rounds.busy:
                break
            await asyncio.sleep(0.02)
        assert sorted(said) == [("s1", "s1 did its part"), ("s2", "s2 did its part")]
        assert not rt.rounds.busy
        posts = rt.spaces.services.board.read("s1")
        assert posts[0]["topic"] == "task" and posts[0]["text"] == "split the work"
        assert {p["channel"] for p in posts[1:]} == {"s1", "s2"}
        for channel in ("s1", "s2"):  # each turn is an episode, its prompt names the task
            [episode] = [e for e in await rt.store.episodes_since(0) if e.channel_id == channel]
            assert episode.status == "complete"
            assert "split the work" in episode.steps[0].content
        s1, s2 = rt.spaces.context("s1"), rt.spaces.context("s2")
        assert s1.workspace.root == s2.workspace.root
        assert s1.state_dir != s2.state_dir  # each member undoes only its own changes
        assert rt.spaces.context("c9").workspace.root != rt.spaces.context("s1").workspace.root
    finally:
        await rt.close()
