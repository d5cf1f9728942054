"""One turn of a channel's agent: a linear tool-calling loop.

    context -> model -> tool calls -> observations -> model -> ... -> answer

The trajectory is the message list. Each step (the system prompt the model
saw, the user's message, every assistant message with its tool calls, every
tool observation) is committed to the store before the next step starts, so
what the model saw is exactly what is stored. A turn is one episode. Each
assistant step also names the prompt it was generated from: a prefix (system
prompt and tools, channel history, any compaction summary) stored once per
distinct prefix, then the episode's latest steps (``EpisodeContext``).

Errors the model caused (bad JSON, an unknown tool, bad arguments) go back to
it as observations saying what was wrong and what is valid; after
``agent.max_format_errors`` of them in a row the turn ends with a clear
message. Harness bugs are raised. Reasoning (``<think>...</think>``) from
earlier turns is dropped from later contexts, as the night's data drops it.

Two guards (``bot.agent.guards``): a reply whose text is the template's call syntax
(``functions.NAME: {...}``) is run as the call it is or re-asked as a format
error, never delivered; and the same call with the same arguments and result,
repeated ``agent.repeat_limit`` times, gets an observation saying so and then
one ask without tools, for an answer. Both are stored as events for the night.

``Agent.progress(channel, text)`` is told each step and each tool run, so a
front end can show that a turn is working (the console on stderr, Discord as
a status message).

A ``/forget`` of the turn's own episode while it runs (``core.storage.forgetting``)
stops it at its next write, which the store refuses: nothing more of it is stored, the
note or image its last tool made is erased (``bot.forgetting``), and the user is told.

When the context outgrows the window, older messages are compacted into a
summary written by the model (``bot.agent.compaction``); an answer that reads as
unfinished is questioned once (``bot.agent.stray``).
"""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from bot.agent.compaction import SchemaSize, compacted, summarise, to_compact
from bot.agent.guards import (RepeatWatch, format_note, looks_like_template_call, repeat_note,
                              template_call)
from bot.agent.messages import (
    EpisodeContext,
    assistant_message,
    assistant_step,
    history_messages,
    is_probe_answer,
    outbox_files,
    plain_messages,
    strip_reasoning,
)
from bot.agent.stray import STRAY_CONTINUE, ask_meant_to_continue
from bot.forgetting import forget_refused_step
from core.config import Config
from core.storage.forgetting import EpisodeForgotten
from core.storage.events import Event
from core.storage.store import Prefix, Step, Store, StoredStep
from serving.client import LLM, LLMError, Reply

# Registry error kinds that mean the model formed the call badly (not a tool refusing).
FORMAT_ERRORS = ("unknown_tool", "arguments")
FORGOTTEN_NOTE = ("(this conversation was forgotten (/forget) while I was answering it, so "
                  "I stopped; nothing more of it was stored)")
CUT_NOTE = ("(this reply was cut off: it reached the limit of {tokens} tokens per reply. "
            "Ask me to continue.)")


class ToolResultLike(Protocol):
    ok: bool
    output: str
    meta: dict


class Tools(Protocol):
    """What the agent needs of the tool registry."""

    def schemas(self) -> list[dict]: ...

    async def call(self, name: str, arguments: str | dict, ctx: Any) -> ToolResultLike: ...


@dataclass
class _Turn:
    """The running counts of one turn."""

    channel: str
    episode: int
    ctx: Any  # the channel's tool context
    context: EpisodeContext  # what precedes the episode's messages in the prompt
    steps: int = 0
    tool_rounds: int = 0
    format_errors: int = 0  # malformed tool calls in a row
    asked: bool = False  # the stray end-of-turn question was asked
    flagged: Reply | None = None  # the answer it was asked about
    repeats: RepeatWatch | None = None
    no_tools: bool = False  # a repeated call tripped, or the last step: no tools offered
    plain: bool = False  # ...and the context was rewritten in words for it (plain_messages)
    results: list[tuple[str, str]] = field(default_factory=list)  # (tool, output) this turn
    last_step_id: int | None = None  # the latest stored assistant step


@dataclass
class TurnResult:
    channel: str
    reply: str
    episode_id: int
    ok: bool
    steps: int = 0
    tool_rounds: int = 0  # the model's rounds of tool calls (steps also count retries)
    files: list[str] = field(default_factory=list)  # workspace files to upload with the reply


class TurnEnded(Exception):
    """Ends a turn early; ``message`` is what the user is told."""

    def __init__(self, message: str, status: str = "aborted") -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class Agent:
    """Runs turns; per-channel state lives in the store and the tool context."""

    def __init__(self, config: Config, llm: LLM, store: Store, tools: Tools,
                 context_for: Callable[[str], Any],
                 sys_section: Callable[[str], str] = lambda channel: "",
                 stray: Any = None) -> None:
        self.config = config
        self.stray = stray  # a channels.StrayDetector, or None to never ask
        self.llm = llm
        self.store = store
        self.tools = tools
        self.context_for = context_for
        self.sys_section = sys_section
        # (channel, what the turn is doing now); a front end replaces it to show progress.
        self.progress: Callable[[str, str], None] = lambda channel, text: None
        # More system-prompt sections, by channel ("" adds none): e.g. a swarm member's task.
        self.prompt_hooks: list[Callable[[str], str]] = []
        self._schema_size = SchemaSize()

    # -- the turn -------------------------------------------------------------

    async def turn(self, channel: str, text: str, speaker: str = "user") -> TurnResult:
        history = await self.store.channel_history(channel, self.config.agent.history_steps)
        system = self.system_prompt(channel)
        # The tool schemas are stored with the prompt (once per tool set, by reference):
        # the night renders what the model saw. Episode, prompt, prefix and message: one commit.
        tools_ref = await self.store.tool_set_ref(self.tools.schemas())
        messages = [{"role": "system", "content": system}, *history_messages(history),
                    {"role": "user", "content": text}]
        context = EpisodeContext(len(messages) - 1, tools_ref, {s.episode_id for s in history})
        now = time.time()
        episode, _ = await self.store.start_turn(channel, self.config.model.alias, [
            Step(role="system", content=system, meta={"tools_ref": tools_ref}, started_at=now),
            Step(role="user", content=text, name=speaker, started_at=now)], name=channel,
            prefix=context.opening(messages))
        return await self.run(channel, episode, messages, context)

    async def run(self, channel: str, episode: int, messages: list[dict],
                  context: EpisodeContext) -> TurnResult:
        """Continue a turn from ``messages`` until an answer, a limit or an error::

            loop:
                stop at the step limit; the last step has no tools (_count_step)
                compact the context if it would overflow      (_fit)
                ask the model, store its message              (_step)
                tool calls?  run them, store the observations (_tool_round)
                             and stop after too many malformed calls in a row;
                             a call repeated with the same result: no tools next,
                             asked from the conversation in words (_plain)
                call syntax as text?  re-ask, a format error  (_format_error)
                no calls?    ask whether it meant to stop     (_meant_to_continue)
                             otherwise it is the answer       (_answer)

        A ``TurnEnded`` (a limit, a server failure) ends the turn with its message;
        anything else is a harness bug: the episode is marked errored and it is raised.
        """
        turn = _Turn(channel, episode, self.context_for(channel), context,
                     repeats=RepeatWatch(self.config.agent.repeat_limit))
        try:
            while True:
                self._count_step(turn)
                messages = await self._fit(turn, messages)
                if turn.no_tools and not turn.plain:
                    messages = self._plain(turn, messages)
                reply, stored = await self._step(turn, messages)
                if reply.tool_calls:
                    await self._tool_round(turn, messages, reply.tool_calls)
                elif looks_like_template_call(reply.content):
                    await self._format_error(turn, messages, reply.content)
                elif turn.flagged and is_probe_answer(reply.content):
                    # Told to go on, the model wrote the probe's JSON again, not work: the
                    # answer it was asked about stands (the embedded model did this).
                    return await self._answer(turn, turn.flagged)
                elif not await self._stray(turn, messages, reply, stored):
                    return await self._answer(turn, reply)
        except TurnEnded as end:
            await self.store.end_episode(episode, end.status)
            return TurnResult(channel, end.message, episode, ok=False, steps=turn.steps,
                              tool_rounds=turn.tool_rounds, files=outbox_files(turn.ctx))
        except EpisodeForgotten:  # the forget closed the episode; its files are not sent
            outbox_files(turn.ctx)
            return TurnResult(channel, FORGOTTEN_NOTE, episode, ok=False, steps=turn.steps,
                              tool_rounds=turn.tool_rounds)
        except BaseException:
            await self.store.end_episode(episode, "errored")
            raise

    def _plain(self, turn: _Turn, messages: list[dict]) -> list[dict]:
        """Rewrite the context in words for the answer without tools (``plain_messages``).
        Like a compaction, it is a new prompt prefix, stored for the night: the rows
        train the answer on what was sent, with no tool list."""
        turn.plain = True
        plain = plain_messages(messages, turn.context.start, turn.results)
        turn.context = EpisodeContext(len(plain), None, turn.context.sources | {turn.episode})
        return plain

    def _count_step(self, turn: _Turn) -> None:
        if turn.steps >= self.config.agent.max_steps:
            raise TurnEnded(f"(stopped after {turn.steps} steps without a final answer; "
                            "ask me to continue if needed)")
        turn.steps += 1
        if turn.steps == self.config.agent.max_steps:
            # A call made now could never be answered: the last step is asked for words
            # (the embedded model looped through its tools to the limit on "Hello").
            turn.no_tools = True

    async def _step(self, turn: _Turn, messages: list[dict]) -> tuple[Reply, StoredStep]:
        self.progress(turn.channel, f"step {turn.steps}: thinking")
        offered = set() if turn.no_tools else self.tool_names()
        reply = template_call(await self._ask(messages, tools=bool(offered)), offered)
        step = assistant_step(reply)
        # The exact prompt, for the night (core.storage.prefixes).
        meta, prefix = turn.context.for_step(messages, bool(offered))
        step.meta = {**(step.meta or {}), "context": meta}
        stored = await self._store(turn.episode, step, prefix)
        if prefix is not None:
            turn.context.saved()
        turn.last_step_id = stored.id
        messages.append(assistant_message(reply))
        return reply, stored

    async def _tool_round(self, turn: _Turn, messages: list[dict], calls: list[dict]) -> None:
        turn.tool_rounds += 1
        bad = await self._run_tools(turn, messages, calls)
        self._count_format_error(turn, bad)

    async def _format_error(self, turn: _Turn, messages: list[dict], text: str) -> None:
        """Call syntax as text that is no valid call: say what is valid and ask again."""
        note = format_note(text, set() if turn.no_tools else self.tool_names())
        await self._store(turn.episode, Step(role="user", content=note,
                                             meta={"probe": "format"}))
        messages.append({"role": "user", "content": note})
        await self.store.add_event(turn.channel, turn.episode, Event.TEMPLATE_SYNTAX,
                                   {"text": text[:200]})
        self._count_format_error(turn, True)

    def _count_format_error(self, turn: _Turn, bad: bool) -> None:
        turn.format_errors = turn.format_errors + 1 if bad else 0
        if turn.format_errors >= self.config.agent.max_format_errors:
            raise TurnEnded(f"(I could not form a valid tool call {turn.format_errors} "
                            "times in a row, so I stopped; please rephrase the request)")

    async def _stray(self, turn: _Turn, messages: list[dict], reply: Reply,
                     stored: StoredStep) -> bool:
        """True when a flagged answer was not meant to end the turn (asked once a turn)."""
        if turn.asked or self.stray is None or reply.finish_reason == "length":
            return False  # a reply cut at the limit did not choose to end; _answer says so
        reason = self.stray.flag(strip_reasoning(reply.content), turn.tool_rounds)
        if not reason:
            return False
        turn.asked, turn.flagged = True, reply
        return await self._meant_to_continue(turn.channel, turn.episode, messages, stored, reason)

    async def _answer(self, turn: _Turn, reply: Reply) -> TurnResult:
        await self._end_of_turn(turn.ctx)
        await self.store.end_episode(turn.episode, "complete")
        text = strip_reasoning(reply.content).strip()
        if reply.finish_reason == "length":  # never delivered as if it were finished
            text = (text + "\n\n" if text else "") + CUT_NOTE.format(
                tokens=self.config.agent.max_reply_tokens)
        return TurnResult(turn.channel, text, turn.episode,
                          ok=True, steps=turn.steps, tool_rounds=turn.tool_rounds,
                          files=outbox_files(turn.ctx))

    async def _end_of_turn(self, ctx: Any) -> None:
        if self.config.agent.clear_scratch_after_turn and "clear_scratch" in self.tool_names():
            await self.tools.call("clear_scratch", {}, ctx)  # through the journal: undoable

    def tool_names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools.schemas()}

    def system_prompt(self, channel: str) -> str:
        return self.system_prompt_for(self.sys_section(channel), channel)

    def system_prompt_for(self, section: str, channel: str = "") -> str:
        """The system prompt with a channel's editable section ("" for a fresh channel)
        and what the prompt hooks add for it (a swarm member's task)."""
        parts = [self.config.agent.system_prompt]
        section = section.strip()
        if section:
            parts.append("Your own notes for this channel (you edit them with update_sys):\n"
                         + section)
        parts += [extra for hook in self.prompt_hooks if (extra := hook(channel).strip())]
        return "\n\n".join(parts)

    # -- steps ----------------------------------------------------------------

    async def _ask(self, messages: list[dict], tools: bool = True) -> Reply:
        try:
            return await self.llm.chat(messages,
                                       tools=(self.tools.schemas() or None) if tools else None,
                                       max_tokens=self.config.agent.max_reply_tokens,
                                       temperature=self.config.agent.temperature)
        except LLMError as exc:
            raise TurnEnded(f"(the model server failed: {exc})", status="errored") from exc

    async def _run_tools(self, turn: _Turn, messages: list[dict], calls: list[dict]) -> bool:
        """Run each call in order and store its observation; True if any was malformed."""
        episode, malformed = turn.episode, False
        for call in calls:
            name = call["function"]["name"]
            self.progress(turn.channel, f"step {turn.steps}: running {name}")
            started = time.time()
            result = await self.tools.call(name, call["function"]["arguments"], turn.ctx)
            malformed |= result.meta.get("error") in FORMAT_ERRORS
            output = self.observation(result)
            turn.results.append((name, output))
            output = await self._repeat_check(turn, call, output)
            step = Step(role="tool", content=output, tool_call_id=call.get("id"), name=name,
                        started_at=started, duration_ms=(time.time() - started) * 1000,
                        meta={"ok": result.ok, **result.meta})
            try:
                await self._store(episode, step)
            except EpisodeForgotten:  # what its tool made after the forget goes too
                await forget_refused_step(self.store, turn.ctx, step)
                raise
            messages.append({"role": "tool", "tool_call_id": call.get("id") or "",
                             "name": name, "content": output})
            if result.ok and "image" in result.meta and self.config.model.vision:
                await self._attach_image(episode, messages, result.meta["image"])
        return malformed

    async def _repeat_check(self, turn: _Turn, call: dict, output: str) -> str:
        """``output``, with a note once the same call has given it ``repeat_limit`` times;
        the next ask then offers no tools (seed lesson: repeated polling)."""
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        count = turn.repeats.see(name, arguments, output)
        if not turn.repeats.tripped(count):
            return output
        turn.no_tools = True
        await self.store.add_event(turn.channel, turn.episode, Event.REPEATED_CALL, {
            "lesson": "repeated polling", "tool": name, "arguments": str(arguments)[:500],
            "count": count, "step": turn.steps, "step_id": turn.last_step_id})
        return output + repeat_note(count)

    async def _attach_image(self, episode: int, messages: list[dict], image: dict) -> None:
        """Show a viewed image to a vision model; the step records its cached hash."""
        data = await asyncio.to_thread(Path(image["cache_path"]).read_bytes)
        url = f"data:{image.get('mime', 'image/png')};base64,{base64.b64encode(data).decode()}"
        text = f"(the image {image['sha256'][:12]} from view_image)"
        await self._store(episode, Step(role="user", content=text, meta={"image": image}))
        messages.append({"role": "user", "content": [
            {"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]})

    def observation(self, result: ToolResultLike) -> str:
        """A tool's result as the model is shown it: errors marked, long output cut."""
        return self._truncate(result.output if result.ok else f"ERROR: {result.output}")

    def _truncate(self, text: str) -> str:
        limit = self.config.agent.tool_output_chars
        if len(text) <= limit:
            return text
        cut = len(text) - limit
        return (text[:limit] + f"\n[... {cut} more characters cut: the output was too long. "
                "Read it in parts, e.g. with read_file and an offset.]")

    async def _store(self, episode: int, step: Step, prefix: Prefix | None = None) -> StoredStep:
        if not step.started_at:
            step.started_at = time.time()
        return await self.store.add_step(episode, step, prefix=prefix)

    # -- stray end of turn -----------------------------------------------------

    async def _meant_to_continue(self, channel: str, episode: int, messages: list[dict],
                                 flagged: StoredStep, reason: str) -> bool:
        """Ask whether the turn really ended (bot.agent.stray); True when it goes on."""
        async def probe(role: str, text: str) -> None:
            await self._store(episode, Step(role=role, content=text, meta={"probe": "stray"}))
            messages.append({"role": role, "content": text})

        answer = await ask_meant_to_continue(self.llm, messages, probe)
        if answer is None:
            return False  # the server failed: the answer stands, and no event is stored
        await self.store.add_event(channel, episode, Event.STRAY_END_OF_TURN, {
            "step_id": flagged.id, "seq": flagged.seq, "reason": reason, "answer": answer})
        if answer != "no":
            return False
        await probe("user", STRAY_CONTINUE)
        return True

    # -- context overflow -----------------------------------------------------

    async def _fit(self, turn: _Turn, messages: list[dict]) -> list[dict]:
        """Compact older messages into a summary when the context would overflow."""
        old = to_compact(self.config, messages, self._schema_size.tokens(self.tools.schemas()))
        if not old:
            return messages
        try:
            summary = await summarise(self.llm, messages[1:old + 1])
        except LLMError as exc:
            raise TurnEnded(f"(the model server failed while compacting: {exc})",
                            status="errored") from exc
        # ``sources``: the episodes it may summarise, so that /forget of one empties it.
        await self.store.add_event(turn.channel, turn.episode, Event.COMPACTION,
                                   {"messages": old, "summary": summary, "sources": sorted(
                                       turn.context.sources | {turn.episode})})
        turn.context.compacted(old + 1, turn.episode)
        return compacted(messages, old, summary)
