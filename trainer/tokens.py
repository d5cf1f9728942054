"""Training rows as the tokens the served model saw, with a kind per token.

A row (one episode from the night's JSONL) becomes one or two token
sequences. Each token has a kind and the index of the row message it came from:

- ``ACTION``: what the model generated in an assistant message (text or tool
  calls), up to and including its ``<|im_end|>``; OAPL trains these.
- ``OBSERVATION``: user messages and tool outputs; ECHO predicts these.
- ``IGNORE``: the system prompt, the tool list and the template's glue
  (role headers, ``Result of NAME:`` prefixes, newlines the harness inserted),
  and harness text that neither the model nor the user wrote: the messages a
  row lists in ``harness`` (the stray-turn probe: its question, the agent's
  forced JSON answer, the go-ahead) and the notice the agent appends to a tool
  output it cut (``CUT_NOTICE``). They stay in the context, as the model saw
  them, but are neither trained (not actions) nor predicted (not observations).

The server is ``llama_cpp.server --chat_format chatml-function-calling``
(llama-cpp-python 0.3.36) started through ``core.model.shim``, which turns off
the template's HTML autoescape, fed with ``core.model.wire.server_messages``. Its
template (``llama_chat_format.chatml_function_calling``) is replicated here
character for character, checked by the tests against the library itself (with
the shim's patch applied):

- with tools (``tool_choice="auto"``) the tool list is appended to the system
  message, assistant text is shown as ``message:\\n...`` and tool calls as
  ``functions.NAME:\\nARGS`` (several calls concatenated, no separator);
- without tools (``"none"``, or no tools at all) it is plain ChatML;
- every string is rendered raw (a ``"`` or ``<`` in a file or in the model's
  own arguments reads as itself), except the tool list: ``tojson`` sorts keys
  and escapes ``<>&'`` as ``\\u003c``... whatever the autoescape setting;
- special-token text in any content (``<|im_end|>`` in a file) was broken by
  a zero-width space before the template saw it (``core.model.special_tokens``, via
  ``server_messages``), so it is rendered, and trained, as the plain text the
  model read;
- llama.cpp tokenizes the whole prompt in one go, parsing special tokens and
  adding no BOS for SmolLM2 (``tokenizer.ggml.add_bos_token`` is false); the
  HF tokenizer with ``add_special_tokens=False`` gives the same ids.

Two views, because the bot generates under two renderings (``serving.client``): a
tool call under ``auto`` (the tool list in the prompt), a text answer under the
``none`` retry or a request without tools (plain ChatML). Each rendering is
prefix-preserving, so one sequence per rendering gives every action its exact
context:

- ``tools`` view (rows with tools): actions = assistant messages with tool
  calls, and the choices of each text answer the model chose to give under
  the tool list (the message's ``choice``, from the step's meta: the ``auto``
  request came back as words, and the ``none`` retry wrote them). The handler
  makes two: ``message:`` against each ``functions.NAME:``, then, on the
  prompt plus ``message:\n``, ``<|im_end|>`` against each ``functions.NAME:``
  again (a head there is asked again as that call: ``serving.client``).
  Both are trained. Without the first the night could lower a wrong tool call
  but never raise the choice to answer, and a 135M model under a tool list
  picks a tool for "What is 3 times 9?"; without the second, a night whose
  examples call ``write_file`` taught the untrained second choice to name it
  for every sum (bench/learning.py); observations counted here;
- ``plain`` view: actions = text answers (all assistant messages when the row
  has no tools); observations counted here only when there is no tools view
  (no tools, or none called), so ECHO never sees a token twice. Otherwise it
  stops after its last action.

Simplifications, where the rendering is not exact:

- An action is rendered as generated, not as the template re-renders it: tool
  calls as llama-cpp produced them, each ``functions.NAME:\\nARGS\\n`` and then
  ``<|im_end|>`` (the harness's ``\\n``s are IGNORE). Later requests showed
  them newline-less, so in the tools view the context of every action after
  the first differs from the server's by those newlines. Text answers read the
  same either way (raw text, then ``<|im_end|>\\n``), so the plain view's
  context is exact throughout, as text; only an empty answer, which the
  template drops entirely, differs.
- Generated tokens are not stored, only text. Each action is tokenized apart
  from the context before it, as it was generated after a tokenized prompt, so
  no token straddles the prompt and the answer (and rendering stays
  prefix-preserving); within the answer the tokenizer's split may differ from
  the one sampled. Elsewhere the text is tokenized whole, as llama.cpp does; a
  token takes the kind of its last character.
- The HF tokenizer splits a run of whitespace before a digit differently from
  llama.cpp's (``"\\n     1"``, read_file's line numbers, is 3 tokens here and 2
  on the server; ``"a  \\n1"`` too): the same text and vocabulary, a token more
  or less there (tests/test_context_real.py counts the server's way).
- In the tools view a text answer is its two choices, ``message:\n<|im_end|>``
  (the end spelled out in plain tokens, as the handler's grammar has it written),
  without its words (which the plain view trains), so a message after it there
  (after the stray probe) reads a context without them; the server showed
  ``message:\nWORDS<|im_end|>``.
- A text answer in a row with tools is assumed to come from the ``none`` retry
  (the only way this format returns text); a message with both text and tool
  calls (never produced by this format) keeps its text as IGNORE context.
- A row that offered tools but called none has only the plain view, so its
  observations are read there, without the tool list the ``auto`` requests
  showed before them.
- The messages are assumed to be exactly those sent: ``trainer.context`` builds
  rows from the stored prompt (prefix: system prompt, channel history, any
  compaction summary; then the episode), one row per compaction. A row's first
  ``context`` messages are IGNORE, like harness text: seen, never trained or
  observed. ``<think>`` reasoning is collect's business.

Other chat formats are refused with a clear error rather than rendered wrongly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from jinja2.utils import htmlsafe_json_dumps

from core.model.wire import FUNCTION_CALLING, server_messages, tool_result_parts

IGNORE, ACTION, OBSERVATION = 0, 1, 2
GENERATION_PROMPT = "<|im_start|>assistant\n"
END = "<|im_end|>"
# bot.agent.loop's note at the end of a tool output it cut: "\n[... N more characters cut: ...]".
CUT_NOTICE = re.compile(r"\n\[\.\.\. \d+ more characters cut[^\]]*\]\Z")

_TOOL_INTRO = "\n\nYou have access to the following functions:\n"
_TOOL_OUTRO = (
    "\n\nYou can respond to users messages with either a single message or one or more function calls."
    "\n\nTo respond with a message begin the message with 'message:', use the following format:"
    "\n\nmessage:"
    "\n<message>"
    "\n\nTo respond with one or more function calls begin the message with "
    "'functions.<function_name>:', use the following format:"
    "\n\nfunctions.<function_name>:"
    '\n{ "arg1": "value1", "arg2": "value2" }'
    "\nfunctions.<function_name>:"
    '\n{ "arg1": "value1", "arg2": "value2" }'
)


@dataclass
class Rendered:
    """One training sequence: tokens, their kinds and messages, and the targets."""

    view: str  # "tools" | "plain"
    ids: list[int]  # (T,)
    kinds: list[int]  # (T,) IGNORE | ACTION | OBSERVATION
    messages: list[int]  # (T,) row message index; -1 for template glue
    advantages: dict[int, float] = field(default_factory=dict)  # judged action message -> A_i
    token_advantages: dict[int, float] = field(default_factory=dict)  # token position -> A_tok
    imitated: set[int] = field(default_factory=set)  # action messages trained by likelihood
    heads: set[int] = field(default_factory=set)  # positions of the tools view's choices

    def action_positions(self, message: int) -> list[int]:
        return [t for t, (k, m) in enumerate(zip(self.kinds, self.messages))
                if k == ACTION and m == message]


@dataclass
class _Segment:
    text: str
    kind: int
    message: int
    literal: bool = False  # tokenized as plain text: special-token text spelled out
    head: bool = False  # a choice under the tool list: `message:` and the end after it, or `functions.NAME:`


# -- the template, segment by segment --------------------------------------------


def _system(content: Any, tools: list[dict], i: int) -> list[_Segment]:
    segs = [_Segment(str(content), IGNORE, i)]
    if tools:
        listing = "".join(
            f"\nfunctions.{t['function']['name']}:\n"
            f"{htmlsafe_json_dumps(t['function']['parameters'], sort_keys=True)}\n"
            for t in tools)
        segs.append(_Segment(_TOOL_INTRO + listing + _TOOL_OUTRO, IGNORE, -1))
    return [*segs, _Segment(END + "\n", IGNORE, -1)]


def _user(original: dict, sent: dict, i: int, observe: bool) -> list[_Segment]:
    kind = OBSERVATION if observe else IGNORE
    if original.get("role") == "tool":
        prefix, output = tool_result_parts(original)  # neutralised, as the server read them
        output = str(output)
        notice = CUT_NOTICE.search(output)
        cut = notice.start() if notice else len(output)
        body = [_Segment(prefix, IGNORE, -1), _Segment(output[:cut], kind, i),
                _Segment(output[cut:], IGNORE, -1)]
    else:
        body = [_Segment(str(sent["content"]), kind, i)]
    return [*body, _Segment(END + "\n", IGNORE, -1)]


def _assistant_as_rendered(sent: dict, tools: list[dict], i: int) -> list[_Segment]:
    """The template's re-rendering: what later requests showed the model."""
    segs = []
    content = sent.get("content")
    if content:
        segs.append(_Segment(("message:\n" if tools else "") + str(content) + END + "\n", IGNORE, i))
    if "tool_calls" in sent:
        calls = "".join(f"functions.{c['function']['name']}:\n{c['function']['arguments']}"
                        for c in sent["tool_calls"])
        segs.append(_Segment(calls + END + "\n", IGNORE, i))
    return segs


def chose_words(message: dict) -> bool:
    """Whether a text answer was the model's choice under the tool list (the step's meta)."""
    return message.get("choice") == "message" and not message.get("tool_calls")


def _assistant_as_generated(sent: dict, tools: list[dict], i: int) -> list[_Segment]:
    """What the model produced: raw text, or llama-cpp's call-by-call sequence; under
    the tool list, a text answer is its two choices: ``message:``, then, after the
    handler's ``\n``, the end rather than a call's head (the words came after, from
    the plain view's request)."""
    calls = sent.get("tool_calls")
    if not calls and tools:
        # The handler's grammar keeps the end-of-generation token out until it is complete,
        # so the model spells the end out ("<", "|", "im", ...): "<" against "functions"
        # is the choice, greedy on that first token.
        return [_Segment("message:", ACTION, i, head=True), _Segment("\n", IGNORE, -1),
                _Segment(END, ACTION, i, literal=True, head=True), _Segment("\n", IGNORE, -1)]
    if not calls:
        return [_Segment(str(sent.get("content") or ""), ACTION, i),
                _Segment(END, ACTION, i), _Segment("\n", IGNORE, -1)]
    segs = _assistant_as_rendered({"content": sent.get("content")}, tools, -1)  # never both, in practice
    for call in calls:
        segs += [_Segment(f"functions.{call['function']['name']}:", ACTION, i, head=True),
                 _Segment("\n", IGNORE, -1),
                 _Segment(str(call["function"]["arguments"]), ACTION, i),
                 _Segment("\n", IGNORE, -1)]
    return [*segs, _Segment(END, ACTION, i), _Segment("\n", IGNORE, -1)]


def _segments(messages: list[dict], tools: list[dict], actions: set[int],
              observe: bool, harness: frozenset[int] = frozenset()) -> list[_Segment]:
    segs = []
    for i, (original, sent) in enumerate(zip(messages, server_messages(messages, FUNCTION_CALLING))):
        role = sent.get("role")
        segs.append(_Segment(f"<|im_start|>{role}\n", IGNORE, -1))
        if role == "system":
            segs += _system(sent["content"], tools, i)
        elif role == "user":
            segs += _user(original, sent, i, observe and i not in harness)
        elif role == "assistant":
            maker = _assistant_as_generated if i in actions else _assistant_as_rendered
            segs += maker(sent, tools, i)
        # Any other role: the template renders its header and nothing else.
    return segs


# -- public API -----------------------------------------------------------------


def render_prompt(messages: list[dict], tools: list[dict] | None,
                  tool_choice: str = "auto") -> str:
    """The exact prompt text the server builds for a request with these messages.

    ``messages`` are in the store's OpenAI shape (``tool`` roles and all);
    ``tool_choice`` is ``"auto"`` or ``"none"`` as ``serving.client`` sends them (a
    request naming a tool, after a bare call head, is the ``auto`` prompt followed by
    the call's head ``functions.NAME:\\n``).
    """
    if tool_choice not in ("auto", "none"):
        raise ValueError(f"tool_choice must be 'auto' or 'none', not {tool_choice!r}")
    shown = list(tools or []) if tool_choice == "auto" else []
    return "".join(s.text for s in _segments(messages, shown, set(), True)) + GENERATION_PROMPT


def action_messages(messages: list[dict], tools: list[dict] | None, view: str,
                    harness: frozenset[int] = frozenset()) -> set[int]:
    """The assistant messages generated under ``view``'s rendering (see the module doc);
    ``harness`` messages are never actions."""
    assistants = [i for i, m in enumerate(messages)
                  if m.get("role") == "assistant" and i not in harness]
    if view == "tools":
        return {i for i in assistants
                if messages[i].get("tool_calls") or chose_words(messages[i])} if tools else set()
    if view == "plain":
        return {i for i in assistants if not (tools and messages[i].get("tool_calls"))}
    raise ValueError(f"view must be 'tools' or 'plain', not {view!r}")


def render(messages: list[dict], tools: list[dict] | None, tokenizer: Any, *, view: str,
           observe: bool | None = None, add_generation_prompt: bool = False,
           harness: frozenset[int] = frozenset()) -> Rendered:
    """Tokens, kinds and message indices of ``messages`` under one view.

    ``observe`` marks user and tool contents as observations; by default only
    where ``render_row`` counts them (the tools view, or rows without tools).
    ``harness`` lists messages that are the harness's text (all IGNORE).
    """
    tools = list(tools or [])
    harness = frozenset(harness)
    actions = action_messages(messages, tools, view, harness)
    if observe is None:
        observe = view == "tools" or not tools
    segs = _segments(messages, tools if view == "tools" else [], actions, observe, harness)
    if add_generation_prompt:
        segs.append(_Segment(GENERATION_PROMPT, IGNORE, -1))
    char_kind, char_msg, char_head, cuts, seen, literal = [], [], [], [], set(), set()
    for s in segs:
        if (s.kind == ACTION and s.message not in seen) or s.literal:
            seen.add(s.message)  # an answer starts (or a literal): tokenize it apart
            cuts.append(len(char_kind))
        if s.literal:
            literal.add(len(char_kind))
            cuts.append(len(char_kind) + len(s.text))
        char_kind += [s.kind] * len(s.text)
        char_msg += [s.message] * len(s.text)
        char_head += [s.head] * len(s.text)
    ids, kinds, msgs, heads = [], [], [], set()
    text = "".join(s.text for s in segs)
    for start, stop in zip([0, *cuts], [*cuts, len(text)]):
        if start == stop:
            continue
        enc = tokenizer(text[start:stop], add_special_tokens=False, return_offsets_mapping=True,
                        split_special_tokens=start in literal)
        ids += enc["input_ids"]
        for first, end in enc["offset_mapping"]:
            last = start + max(end - 1, first)  # a token belongs to the segment of its last character
            if char_head[last]:
                heads.add(len(kinds))
            kinds.append(char_kind[last])
            msgs.append(char_msg[last] if char_kind[last] != IGNORE else -1)
    return Rendered(view, ids, kinds, msgs, heads=heads)


def render_row(row: dict, tokenizer: Any, *, max_tokens: int | None = None,
               chat_format: str = FUNCTION_CALLING) -> list[Rendered]:
    """A JSONL row as its training sequences (one per view that holds an action)."""
    if chat_format != FUNCTION_CALLING:
        raise ValueError(f"trainer.tokens renders only {FUNCTION_CALLING!r}, not {chat_format!r}; "
                         "set model.chat_format to it or add a renderer for the format")
    messages, tools = row["messages"], row.get("tools") or []
    # The context-only lead (prompt prefix, steps an earlier row rendered) counts as harness.
    harness = frozenset(row.get("harness") or ()) | frozenset(range(row.get("context") or 0))
    out = []
    tool_actions = action_messages(messages, tools, "tools", harness)
    if tool_actions:
        out.append(_finish(render(messages, tools, tokenizer, view="tools", observe=True,
                                  harness=harness), row, tool_actions, max_tokens))
    plain_actions = action_messages(messages, tools, "plain", harness)
    if plain_actions:
        observe = not tool_actions  # observations count once, in the tools view when there is one
        shown = messages if observe else messages[: max(plain_actions) + 1]
        out.append(_finish(render(shown, tools, tokenizer, view="plain", observe=observe,
                                  harness=harness), row, plain_actions, max_tokens))
    return out


def _finish(seq: Rendered, row: dict, actions: set[int], max_tokens: int | None) -> Rendered:
    _attach_targets(seq, row, actions)
    return truncate(seq, max_tokens) if max_tokens else seq


def _attach_targets(seq: Rendered, row: dict, actions: set[int]) -> None:
    advantages = row.get("advantages") or []
    seq.imitated = {i for i in row.get("imitate") or () if i in actions}
    for i in sorted(actions):
        if i < len(advantages) and advantages[i] is not None:
            seq.advantages[i] = float(advantages[i])
    for override in row.get("token_overrides") or []:
        message = override["message"]
        if message not in actions:
            continue
        positions = seq.action_positions(message)
        try:
            position = positions[override.get("token", -1)]
        except IndexError:
            continue  # the override points past the message's tokens: nothing to train
        seq.token_advantages[position] = float(override["advantage"])


def truncate(seq: Rendered, max_tokens: int) -> Rendered:
    """The first ``max_tokens`` tokens; an action cut in two no longer counts as one."""
    if len(seq.ids) <= max_tokens:
        return seq
    cut = {m for k, m in zip(seq.kinds[max_tokens:], seq.messages[max_tokens:]) if k == ACTION}
    kinds = [IGNORE if (k == ACTION and m in cut) else k
             for k, m in zip(seq.kinds[:max_tokens], seq.messages[:max_tokens])]
    return Rendered(
        seq.view, seq.ids[:max_tokens], kinds, seq.messages[:max_tokens],
        {m: a for m, a in seq.advantages.items() if m not in cut},
        {t: a for t, a in seq.token_advantages.items() if t < max_tokens and seq.messages[t] not in cut},
        seq.imitated - cut,
        {t for t in seq.heads if t < max_tokens and seq.messages[t] not in cut},
    )
