"""The console front end: line parsing, and the README's piped run end to end."""

from __future__ import annotations

import io
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bot.console import ConsoleRenderer, parse_line, run_console

ROOT = Path(__file__).resolve().parents[1]


def test_parse_line_routes_hash_name_to_that_channel():
    line = parse_line("#dev-ops  fix the build\n", "general")
    assert (line.channel, line.text) == ("dev-ops", "fix the build")


def test_parse_line_without_channel_uses_the_current_one():
    assert parse_line("hello", "random").channel == "random"
    assert parse_line("   \n", "general") is None


async def test_console_answers_each_line_in_order_and_stops_at_eof():
    seen = []

    async def turn(channel, text):
        seen.append((channel, text))
        return f"echo {text}"

    async def command(line, channel):
        return f"ran {line} in {channel}"

    out, err = io.StringIO(), io.StringIO()
    stdin = io.StringIO("#a one\ntwo\n#b three\n/status\n#c !sleep\n")
    await run_console(turn, command, ConsoleRenderer(out, err), stdin)
    assert seen == [("a", "one"), ("a", "two"), ("b", "three")]
    # A command's answer is on stdout with the replies (a pipe captures /status).
    assert out.getvalue().splitlines() == ["[#a] echo one", "[#a] echo two", "[#b] echo three",
                                           "ran /status in b", "ran !sleep in c"]
    assert err.getvalue() == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


async def console_with_agent(tmp_path, err):
    """run_console over a real Agent (store, loop) with a scripted model that calls a tool."""
    from bot.agent.loop import Agent
    from core.config import Config
    from core.storage.store import Store
    from tests.scripted import ScriptedLLM, call, say
    from tests.test_agent import AddTools

    config = Config()
    config.paths.data_dir = tmp_path
    store = await Store.open(tmp_path / "store.db")
    llm = ScriptedLLM([call("add", {"a": 2, "b": 3}), say("5")])
    agent = Agent(config, llm, store, AddTools(), context_for=lambda channel: None)
    out, renderer = io.StringIO(), ConsoleRenderer(io.StringIO(), err)
    renderer.out = out
    agent.progress = renderer.progress

    async def turn(channel, text):
        return await agent.turn(channel, text)

    try:
        await run_console(turn, None, renderer, io.StringIO("#math what is 2+3?\n"))
    finally:
        await store.close()
    return out.getvalue()


async def test_progress_lines_name_the_step_and_tool_on_a_piped_stderr(tmp_path):
    err = io.StringIO()
    out = await console_with_agent(tmp_path, err)
    assert out == "[#math] 5\n"
    assert err.getvalue().splitlines() == ["[#math] ... step 1: thinking",
                                           "[#math] ... step 1: running add",
                                           "[#math] ... step 2: thinking"]


async def test_on_a_terminal_one_progress_line_is_rewritten_and_cleared(tmp_path):
    err = Terminal()
    await console_with_agent(tmp_path, err)
    shown = err.getvalue()
    assert "\n" not in shown.replace("Nightshift console. /help for help.\n", "")
    assert shown.count("\r\x1b[K[#math] ... ") == 3 and shown.endswith("\r\x1b[K")


@pytest.mark.slow
def test_piped_run_replies_through_the_real_server_and_stores_the_turn(tmp_path, served_gguf,
                                                                       free_port):
    config = tmp_path / "config.toml"
    config.write_text(f'[paths]\ndata_dir = "{tmp_path / "data"}"\n'
                      f'[model]\ngguf = "{served_gguf}"\nhf_dir = "{served_gguf.parent / "smollm2-135m-instruct-hf"}"\n'
                      f'[server]\nport = {free_port}\n'
                      f'[agent]\nmax_reply_tokens = 24\ntemperature = 0\n')
    env = {k: v for k, v in os.environ.items() if k != "DISCORD_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "bot", "--config", str(config), "run"],
                          input="#general hello\n", capture_output=True, text=True,
                          cwd=ROOT, timeout=240, env=env)
    assert done.returncode == 0, done.stderr
    replies = [l for l in done.stdout.splitlines() if l.startswith("[#general] ")]
    assert len(replies) == 1 and len(replies[0]) > len("[#general] ")
    db = sqlite3.connect(tmp_path / "data/nightshift.db")
    rows = db.execute("SELECT role, content FROM steps ORDER BY id").fetchall()
    roles = [r[0] for r in rows]
    assert roles[:2] == ["system", "user"] and rows[1][1] == "hello"
    assert "assistant" in roles
    assert "[#general] ... step 1: thinking" in done.stderr  # progress went to stderr
