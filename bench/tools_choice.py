"""Tool choice against the size of the tool list, with the real model on the real server.

For each tool set (3 tools, 8 tools, all 40), the model gets the agent's system
prompt, the set's schemas and one user message, at temperature 0, through the
bot's own client (so the chat format's "none" re-ask is included). The reply is
read as the agent reads it (``bot.agent.guards.template_call`` turns call syntax
written as text into the call).

- right: the prompt needs a tool that is offered and the model called it, or the
  prompt needs no tool (or one that is not offered) and the model answered in words;
- well-formed: of the calls made, those naming an offered tool with a JSON object
  that satisfies the tool's parameter schema (jsonschema);
- served: right over all prompts, the figure that picks ``agent.tools = "auto"``'s core
  set: a set that does not offer a tool cannot serve that prompt however well it chooses.

    python bench/tools_choice.py [--gguf PATH] [--sizes 3,8,40]

The GGUF is found as the tests find it (--gguf, $NIGHTSHIFT_TEST_GGUF, data/models/...).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import jsonschema

# bench/ holds a tools.py and a sandbox.py of its own: the project root must come first.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.config import Config  # noqa: E402
from bot.agent.guards import looks_like_template_call, template_call  # noqa: E402
from serving.client import LLM  # noqa: E402
from serving.supervisor import ServerSupervisor  # noqa: E402
from bot.agent.tool_profiles import CORE_TOOLS  # noqa: E402
from fixtures import find_gguf, free_port  # noqa: E402
from tools import default_registry  # noqa: E402

# (prompt, the tool it needs, or None for a plain answer). Fixed: the figures compare.
PROMPTS = [
    ("What files are in my workspace?", "list_dir"),
    ("Show me the contents of notes.txt.", "read_file"),
    ("Create a file hello.txt containing the word hi.", "write_file"),
    ("In config.txt, replace the word debug with release.", "edit_file"),
    ("Find every line containing TODO in my files.", "grep"),
    ("Run this Python code and tell me what it prints: print(2**10)", "run_python"),
    ("Undo your last change to the files.", "undo"),
    ("Show the git status of the workspace.", "git_status"),
    ("What is 12 + 7? Reply with only the number.", None),
    ("Name one colour.", None),
    ("Say goodbye in one short sentence.", None),
]
# 3: the core set "auto" gives the embedded model; 8: the core set plus the next most
# useful tools, the larger candidate it was chosen against.
SETS = {3: list(CORE_TOOLS), 8: ["read_file", "write_file", "edit_file", "list_dir", "grep",
                                 "run_python", "undo", "note_create"]}


def tool_set(size: int, everything: list[str]) -> list[str]:
    """A named set, or every tool for any other size (40 stands for "all": 42 tools now)."""
    return SETS.get(size, everything) if size < len(everything) else everything


def judge(reply, offered: dict[str, dict], needed: str | None) -> tuple[bool, bool | None]:
    """(right choice, well-formed call or None when no call was made)."""
    reply = template_call(reply, set(offered))
    if not reply.tool_calls:
        words = reply.content.strip() and not looks_like_template_call(reply.content)
        return bool(words) and needed not in offered, None
    call = reply.tool_calls[0]["function"]
    formed = call["name"] in offered
    if formed:
        try:
            arguments = json.loads(call["arguments"] or "{}")
            jsonschema.validate(arguments, offered[call["name"]]["function"]["parameters"])
        except (ValueError, jsonschema.ValidationError):
            formed = False
    return call["name"] == needed and needed in offered, formed


async def measure(llm: LLM, config: Config, names: list[str]) -> dict:
    registry = default_registry()
    schemas = [s for s in registry.schemas() if s["function"]["name"] in names]
    offered = {s["function"]["name"]: s for s in schemas}
    right = calls = formed = 0
    started = time.perf_counter()
    rows = []
    for prompt, needed in PROMPTS:
        messages = [{"role": "system", "content": config.agent.system_prompt},
                    {"role": "user", "content": prompt}]
        reply = await llm.chat(messages, tools=schemas, max_tokens=64, temperature=0)
        ok, well = judge(reply, offered, needed)
        right += ok
        if well is not None:
            calls += 1
            formed += well
        got = template_call(reply, set(offered))
        rows.append((prompt, needed, got.tool_calls[0]["function"]["name"] if got.tool_calls
                     else "(words)", ok))
    applicable = sum(1 for _, needed in PROMPTS if needed in offered or needed is None)
    right_applicable = sum(ok for (_, needed, _, ok) in rows if needed in offered or needed is None)
    return {"tools": len(names), "right": right, "prompts": len(PROMPTS),
            "applicable": applicable, "right_applicable": right_applicable, "calls": calls,
            "formed": formed, "seconds": time.perf_counter() - started, "rows": rows}


def report(result: dict) -> None:
    calls, right, prompts = result["calls"], result["right"], result["prompts"]
    formed = f"{result['formed']}/{calls} ({100 * result['formed'] / calls:.0f}%)" if calls \
        else "0/0"
    print(f"{result['tools']:>2} tools: right choice {result['right_applicable']}/"
          f"{result['applicable']} of the prompts it can serve; served "
          f"{right}/{prompts} ({100 * right / prompts:.0f}%)"
          f"; well-formed calls {formed}; {result['seconds']:.1f} s")
    for prompt, needed, got, ok in result["rows"]:
        mark = "ok " if ok else "BAD"
        print(f"    {mark} needs {needed or '(words)':<11} got {got:<11} {prompt}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", help="the GGUF to serve")
    parser.add_argument("--sizes", default="3,8,40", help="tool-set sizes, e.g. 3,8,40")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="  [%(name)s] %(message)s")
    gguf = find_gguf(args.gguf)
    everything = default_registry().names()
    print(f"gguf: {gguf.name}, cpus: {os.cpu_count()}, prompts: {len(PROMPTS)}, "
          f"core set: {', '.join(CORE_TOOLS)}")
    with tempfile.TemporaryDirectory(prefix="nightshift-bench-") as tmp:
        config = Config.model_validate({"paths": {"data_dir": tmp},
                                        "server": {"port": free_port()}})
        supervisor = ServerSupervisor(config, gguf=Path(gguf))
        await supervisor.start(watchdog=False)
        try:
            async with LLM(config, supervisor) as llm:
                for size in (int(s) for s in args.sizes.split(",")):
                    report(await measure(llm, config, tool_set(size, everything)))
        finally:
            await supervisor.stop()


if __name__ == "__main__":
    asyncio.run(main())
