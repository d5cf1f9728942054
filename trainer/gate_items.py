"""What the gate evaluates, rendered as the agent renders it, and how a check scores it.

**Items.** A gate item is one request with a way to score the answer:

- the held-out items of practice sets: every ``*.jsonl`` file in
  ``<data_dir>/heldout/`` (and any file named in the night job's
  ``args["heldout"]``) holds one ``{"id", "prompt", "check"}`` per line. The
  practice sets write their held-out split there; the gate never practises
  them. A check is ``{"exact": TEXT}`` (the stripped answer equals TEXT),
  ``{"regex": PATTERN}`` (the pattern is found in the answer) or
  ``{"contains": TEXT}`` (the TEXT appears, case and spacing ignored: the old
  ``night.probes_file`` probes). Other kinds (``{"python": FILE}``) need the
  sandbox and a scorer that can run them (``measure``'s ``scorer``); without
  one such an item is unscored, counted, and left out of the comparison;
- the night's eval split: the first request of each held-out episode, scored
  by the judge (-2..2, mapped to 0..1 so that its differences weigh like a
  check's).

**Rendering.** Each request is sent as the agent sends a fresh channel's first
message: its system prompt and its tool list (``AgentView``), through the
same wire adaptations as the bot's LLM client (``core.model.wire``), with
``tool_choice`` ``auto``, a retry with ``none`` when the answer came back
empty, and one with the tool named when it was a bare call head. The bot
writes the view it uses into the night's inputs when ``!sleep`` creates the
job (``args["agent_view"]``, a JSON file); a night started from the command
line takes the system prompt from the config and the tool list of the newest
stored system step. An answer that is a tool call is scored as its
text form, ``name {"arg": ...}``, one line per call, so that a check can
test the chosen tool and its arguments.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from core.config import Config
from core.model.wire import call_head, needs_tool_choice, server_messages
from core.storage.store import Store
from trainer.loops import reply_text

logger = logging.getLogger("nightshift.gate")

# Open chat, the regression check: a fixed, varied set, so narrow training that hurts
# general conversation shows up (degenerate repetition, or a judged score that falls).
OPEN_PROMPTS = [
    "Say hello to the channel in one sentence.",
    "What is 7 times 8?",
    "Give me three short tips for writing clear emails.",
    "What is a to-do list for? Answer in one sentence.",
    "Name one colour of the sky at sunset.",
    "Explain what a password manager does, briefly.",
    "Suggest a name for a grey cat.",
    "What is the capital of France?",
    "Write a two-line poem about rain.",
    "How many days are there in a leap year?",
    "Summarise why sleep matters, in two sentences.",
    "What does HTML stand for?",
    "Give one idea for a quick healthy breakfast.",
    "Translate 'thank you' into Spanish.",
    "What is the opposite of 'ancient'?",
    "Describe a bicycle to someone who has never seen one, in one sentence.",
    "List three fruits that are red.",
    "Why do we back up files? One sentence.",
    "What is 15 minus 9?",
    "Tell me a fun fact about octopuses.",
    "How do I politely decline a meeting? One sentence.",
    "What is the boiling point of water at sea level in Celsius?",
]


@dataclass
class AgentView:
    """What the agent sends for a fresh channel, besides the user's message."""

    system: str
    tools: list[dict] = field(default_factory=list)

    def render(self, request: str) -> list[dict]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": request}]


@dataclass
class Item:
    id: str
    request: str
    check: dict | None  # None: judged
    # The practice set (its held-out file's name), "probes" or "eval": the night report
    # shows the gate's before/after per family.
    family: str = ""


async def agent_view(config: Config, store: Store, args: dict) -> AgentView:
    """The bot's view from the job's inputs, else the config's prompt and the stored tools."""
    path = args.get("agent_view")
    if path and Path(path).is_file():
        data = json.loads(Path(path).read_text())
        return AgentView(data["system"], data.get("tools") or [])
    tools: list[dict] = []
    for episode in reversed(await store.episodes_since(0)):
        meta = next((s.meta for s in episode.steps if s.role == "system" and s.meta), None)
        if meta and meta.get("tools"):
            tools = meta["tools"]
            break
    return AgentView(config.agent.system_prompt, tools)


def read_items(path: Path) -> list[Item]:
    """A held-out JSONL file's items; a malformed line names its file and line."""
    items = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            items.append(Item(str(data.get("id", f"{path.stem}:{number}")), str(data["prompt"]),
                              dict(data["check"]), path.stem))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a {{prompt, check}} item ({exc})") from None
    return items


def heldout_items(config: Config, args: dict) -> list[Item]:
    folder = config.data_dir / "heldout"
    paths = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    paths += [Path(p) for p in args.get("heldout", [])]
    items = [item for path in paths for item in read_items(path)]
    if config.night.probes_file is not None:  # the older probes: {"prompt", "expected"}
        for number, line in enumerate(config.night.probes_file.read_text().splitlines(), 1):
            if line.strip():
                probe = json.loads(line)
                items.append(Item(f"probe:{number}", probe["prompt"],
                                  {"contains": probe["expected"]}, "probes"))
    return items


def eval_items(rows: list[dict], limit: int) -> list[Item]:
    """The first request of each eval-split episode of the night's dataset, judged."""
    items = []
    for row in rows:
        if row.get("kind") != "episode" or row.get("split") != "eval" or row.get("context_group"):
            continue  # one item per episode: its first row (trainer.context)
        own = row["messages"][row.get("prefix_messages") or 0:]  # after the channel history
        user = next((m for m in own if m["role"] == "user"), None)
        if user and isinstance(user.get("content"), str) and user["content"].strip():
            items.append(Item(f"episode:{row.get('episode_id')}", user["content"], None,
                              "eval"))
    return items[:limit]


def score_check(check: dict, answer: str) -> float | None:
    """A check's score in [0, 1], or None when this kind cannot be run here."""
    if "exact" in check:
        return float(answer.strip() == str(check["exact"]).strip())
    if "regex" in check:
        return float(re.search(str(check["regex"]), answer) is not None)
    if "contains" in check:
        return float(_normal(str(check["contains"])) in _normal(answer))
    return None


def ask_like_agent(llm, requests: list[list[dict]], tools: list[dict], chat_format: str,
                   max_tokens: int) -> list[str]:
    """Greedy replies of an in-process ``llama_cpp.Llama``, each requested as the bot's
    client requests it (serving.client.LLM.chat): ``auto`` first, ``none`` again for a
    reply that came back empty, and the named tool again for a reply that is a bare call
    head (``functions.NAME:``).

    All the ``auto`` requests go first, then the retries: the ``auto`` prompts share the
    system prompt and the tool list (about 3,300 tokens with the full registry), which
    llama.cpp keeps evaluated between consecutive requests, while a ``none`` prompt has no
    tool list and would evict it. Measured on the embedded model, on this loaded 2-core
    CPU: the first ``auto`` request 96 s, the next ones 1-6 s each."""
    def ask(messages: list[dict], choice: str | dict | None) -> dict:
        params = {"messages": server_messages(messages, chat_format), "temperature": 0,
                  "max_tokens": max_tokens}
        if tools:
            params["tools"] = tools
            if choice:
                params["tool_choice"] = choice
        try:
            return llm.create_chat_completion(**params)["choices"][0]["message"]
        except ValueError as exc:
            # llama-cpp-python's function-calling handler writes a call's arguments with no
            # token limit, so an endless argument (a number that never ends) fills the
            # context and raises; the served agent gets the same error. It is a failed
            # answer, scored as the empty answer, and the gate goes on.
            logger.warning("gate request failed: %s", exc)
            return {"content": "", "error": str(exc)}

    auto = "auto" if tools and needs_tool_choice(chat_format) else None
    replies = [ask(messages, auto) for messages in requests]
    if auto:
        for i, message in enumerate(replies):
            if not message.get("tool_calls") and not (message.get("content") or "").strip() \
                    and "error" not in message:
                replies[i] = ask(requests[i], "none")
            elif (name := call_head(message.get("content") or "", tools)) is not None:
                call = ask(requests[i], {"type": "function", "function": {"name": name}})
                if call.get("tool_calls"):
                    replies[i] = call
    return [reply_text(message) for message in replies]


def _normal(text: str) -> str:
    return " ".join(text.lower().split())
