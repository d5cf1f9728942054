"""Training rows render to the tokens the served model saw (chatml-function-calling)."""

from __future__ import annotations

from pathlib import Path

import httpx
import jinja2.sandbox
import pytest
from llama_cpp import llama_chat_format

from core.model.shim import plain_templates
from core.model.wire import FUNCTION_CALLING, server_messages
from tests.shim_server import shim_server
from trainer.tokens import (
    ACTION,
    GENERATION_PROMPT,
    IGNORE,
    OBSERVATION,
    render,
    render_prompt,
    render_row,
    truncate,
)

HF_DIR = Path(__file__).parents[1] / "data/models/smollm2-135m-instruct-hf"

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "required": ["path"],
                   "properties": {"path": {"type": "string", "description": "a <relative> path & 'name'"}}}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}
CALL_B = {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "b.txt"}'}}
# An episode with tools: system, user, two tool calls in one message, their results, a text answer,
# another user turn, a tool call, its result and a last answer. Text holds characters HTML escapes.
EPISODE = [
    {"role": "system", "content": "You are <b>helpful</b> & 'brief'."},
    {"role": "user", "content": 'Read "a.txt" and b.txt <now>.'},
    {"role": "assistant", "content": None, "tool_calls": [CALL, CALL_B]},
    {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": "x < y && z"},
    {"role": "tool", "tool_call_id": "c2", "name": "read_file", "content": "second file"},
    {"role": "assistant", "content": "Both files are short."},
    {"role": "user", "content": "And a.txt again?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": "x < y && z"},
    {"role": "assistant", "content": "It says x < y."},
]
CHAT = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "\n\nBlue."},
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(HF_DIR))


class _Captured(Exception):
    pass


class _PromptCatcher:
    """Stands in for llama_cpp.Llama: the handler's first completion request holds the prompt."""

    verbose = False

    def create_completion(self, prompt: str, **kw):
        raise _Captured(prompt)


def _served_prompt(messages: list[dict], tools: list[dict] | None, tool_choice: str) -> str:
    plain_templates()  # as the server runs it, through core.model.shim
    with pytest.raises(_Captured) as caught:
        llama_chat_format.chatml_function_calling(
            llama=_PromptCatcher(), messages=server_messages(messages, FUNCTION_CALLING),
            tools=tools, tool_choice=tool_choice)
    return caught.value.args[0]


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("cut", range(1, len(EPISODE) + 1))
@pytest.mark.parametrize("tool_choice", ["auto", "none"])
def test_prompt_text_equals_the_shimmed_llama_cpp_template(cut, tool_choice):
    messages = EPISODE[:cut]
    assert render_prompt(messages, TOOLS, tool_choice) == _served_prompt(messages, TOOLS, tool_choice)


def test_prompt_text_equals_template_for_odd_shapes():
    # No system message (so no tool list at all), an unknown role, an empty answer.
    odd = [{"role": "user", "content": "hi"}, {"role": "developer", "content": "ignored"},
           {"role": "assistant", "content": ""}, {"role": "user", "content": "again"}]
    for tools, choice in ((TOOLS, "auto"), (None, "none"), ([], "auto")):
        assert render_prompt(odd, tools, choice) == _served_prompt(odd, tools, choice)


def test_the_model_reads_raw_text_and_only_the_tool_list_is_escaped():
    prompt = render_prompt(EPISODE[:4], TOOLS, "auto")
    assert prompt == _served_prompt(EPISODE[:4], TOOLS, "auto")
    assert '{"path": "a.txt"}functions.read_file:' in prompt  # its own calls; no separator
    assert 'Read "a.txt" and b.txt <now>.' in prompt and "x < y && z" in prompt
    assert "You are <b>helpful</b> & 'brief'." in prompt
    assert not any(escape in prompt for escape in ("&#34;", "&lt;", "&gt;", "&amp;", "&#39;"))
    assert "a \\u003crelative\\u003e path \\u0026 \\u0027name\\u0027" in prompt  # tojson, always
    assert not prompt.startswith("<|endoftext|>")  # no BOS


def test_the_shim_only_turns_autoescape_off_and_applies_once():
    plain_templates()
    patched = llama_chat_format.ImmutableSandboxedEnvironment
    plain_templates()
    assert llama_chat_format.ImmutableSandboxedEnvironment is patched
    assert issubclass(patched, jinja2.sandbox.ImmutableSandboxedEnvironment)  # still sandboxed
    env = patched(autoescape=True, undefined=jinja2.StrictUndefined)
    assert env.autoescape is False and env.undefined is jinja2.StrictUndefined


@pytest.mark.parametrize("view,rows", [("tools", EPISODE), ("plain", EPISODE), ("plain", CHAT)])
def test_rendering_is_prefix_preserving(tokenizer, view, rows):
    tools = TOOLS if rows is EPISODE else None
    for k, message in enumerate(rows):
        if message["role"] != "assistant":
            continue
        head = render(rows[:k], tools, tokenizer, view=view, add_generation_prompt=True)
        full = render(rows[:k + 1], tools, tokenizer, view=view)
        n = len(head.ids)
        assert full.ids[:n] == head.ids, f"message {k}"
        assert full.kinds[:n] == head.kinds[:n] and full.messages[:n] == head.messages[:n]


def test_context_is_exact_up_to_the_tools_views_first_action_and_throughout_plain(tokenizer):
    for view, action in (("tools", 2), ("plain", 5), ("plain", 9)):
        seq = render(EPISODE, TOOLS, tokenizer, view=view)
        choice = "auto" if view == "tools" else "none"
        prompt = _ids(tokenizer, render_prompt(EPISODE[:action], TOOLS, choice))
        assert seq.ids[:len(prompt)] == prompt
        assert seq.kinds[len(prompt)] == ACTION and seq.messages[len(prompt)] == action


def test_plain_chat_context_is_exact_before_every_answer(tokenizer):
    seq = render(CHAT, None, tokenizer, view="plain")
    for k in (2, 4):
        prompt = _ids(tokenizer, render_prompt(CHAT[:k], None, "none"))
        assert seq.ids[:len(prompt)] == prompt
        assert seq.messages[len(prompt)] == k


def _decode(tokenizer, seq, kind, message=None) -> str:
    return tokenizer.decode([i for i, k, m in zip(seq.ids, seq.kinds, seq.messages)
                             if k == kind and (message is None or m == message)])


def test_actions_are_what_the_model_generated(tokenizer):
    tools_view, plain_view = render_row({"messages": EPISODE, "tools": TOOLS}, tokenizer)
    assert tools_view.view == "tools" and plain_view.view == "plain"
    # Tool calls as llama-cpp produced them; the harness's newlines are template glue.
    assert (_decode(tokenizer, tools_view, ACTION, 2)
            == 'functions.read_file:{"path": "a.txt"}functions.read_file:{"path": "b.txt"}<|im_end|>')
    assert _decode(tokenizer, tools_view, ACTION, 7) == 'functions.read_file:{"path": "a.txt"}<|im_end|>'
    # Text answers raw (no HTML escapes), each ending with the end-of-turn token.
    assert _decode(tokenizer, plain_view, ACTION, 5) == "Both files are short.<|im_end|>"
    assert _decode(tokenizer, plain_view, ACTION, 9) == "It says x < y.<|im_end|>"
    assert {m for k, m in zip(tools_view.kinds, tools_view.messages) if k == ACTION} == {2, 7}
    assert {m for k, m in zip(plain_view.kinds, plain_view.messages) if k == ACTION} == {5, 9}
    # The text answer is context in the tools view, shown as the template showed it.
    assert "message:\nBoth files are short.<|im_end|>" in tokenizer.decode(tools_view.ids)


def test_observations_are_user_and_tool_contents_counted_once(tokenizer):
    tools_view, plain_view = render_row({"messages": EPISODE, "tools": TOOLS}, tokenizer)
    assert _decode(tokenizer, tools_view, OBSERVATION, 3) == "x < y && z"  # raw, as served
    assert _decode(tokenizer, tools_view, OBSERVATION, 1) == 'Read "a.txt" and b.txt <now>.'
    assert "Result of" not in _decode(tokenizer, tools_view, OBSERVATION)
    assert OBSERVATION not in plain_view.kinds  # already counted in the tools view
    assert _decode(tokenizer, tools_view, IGNORE).startswith("<|im_start|>system\nYou are <b>helpful</b>")
    (chat,) = render_row({"messages": CHAT, "tools": []}, tokenizer)
    assert _decode(tokenizer, chat, OBSERVATION) == "Hi thereName a colour."


def test_answer_is_tokenized_apart_from_its_prompt_as_it_was_generated(tokenizer):
    (chat,) = render_row({"messages": CHAT, "tools": []}, tokenizer)
    # Tokenized whole, "assistant\n" + "\n\nBlue." would merge "\n\n" across the boundary.
    assert _decode(tokenizer, chat, ACTION, 4) == "\n\nBlue.<|im_end|>"
    start = chat.action_positions(4)[0]
    assert chat.ids[:start] == _ids(tokenizer, render_prompt(CHAT[:4], None, "none"))


def test_tools_offered_but_never_called_leave_observations_to_the_plain_view(tokenizer):
    messages = [*CHAT, {"role": "user", "content": "Bye."}]
    (only,) = render_row({"messages": messages, "tools": TOOLS}, tokenizer)
    assert only.view == "plain"
    assert _decode(tokenizer, only, OBSERVATION) == "Hi thereName a colour.Bye."


def test_plain_view_stops_after_its_last_answer(tokenizer):
    messages = [*EPISODE[:6], {"role": "user", "content": "more"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    tools_view, plain_view = render_row({"messages": messages, "tools": TOOLS}, tokenizer)
    assert max(plain_view.messages) == 5
    assert len(plain_view.ids) < len(tools_view.ids)


def test_advantages_and_the_stray_end_of_turn_override(tokenizer):
    row = {"messages": EPISODE, "tools": TOOLS,
           "advantages": [None, None, 0.5, None, None, 0.25, None, None, None, -0.75],
           "token_overrides": [{"message": 9, "token": -1, "advantage": -1.0}]}
    tools_view, plain_view = render_row(row, tokenizer)
    assert tools_view.advantages == {2: 0.5} and tools_view.token_advantages == {}
    assert plain_view.advantages == {5: 0.25, 9: -0.75}
    (position, advantage), = plain_view.token_advantages.items()
    assert advantage == -1.0 and plain_view.ids[position] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert position == plain_view.action_positions(9)[-1]


def test_truncation_drops_an_action_cut_in_two(tokenizer):
    row = {"messages": CHAT, "tools": [], "advantages": [None, None, 0.5, None, 0.5],
           "token_overrides": [{"message": 4, "token": -1, "advantage": -1.0}]}
    (full,) = render_row(row, tokenizer)
    middle = full.action_positions(4)[1]
    cut = truncate(full, middle + 1)
    assert len(cut.ids) == middle + 1
    assert cut.advantages == {2: 0.5} and cut.token_advantages == {}
    assert 4 not in {m for k, m in zip(cut.kinds, cut.messages) if k == ACTION}
    assert truncate(full, len(full.ids)) is full


def test_no_tools_row_has_one_plain_view_and_generation_prompt_ends_it(tokenizer):
    (only,) = render_row({"messages": CHAT, "tools": []}, tokenizer)
    assert only.view == "plain"
    head = render(CHAT[:2], None, tokenizer, view="plain", add_generation_prompt=True)
    assert tokenizer.decode(head.ids).endswith(GENERATION_PROMPT)


def test_other_chat_formats_are_refused(tokenizer):
    with pytest.raises(ValueError, match="chatml-function-calling"):
        render_row({"messages": CHAT, "tools": []}, tokenizer, chat_format="chatml")


# -- against the real llama.cpp ------------------------------------------------------


@pytest.fixture(scope="module")
def llama(served_gguf):
    import llama_cpp

    plain_templates()  # the handler reads the patched class at each call, as the shimmed server does
    return llama_cpp.Llama(model_path=str(served_gguf), n_ctx=2048,
                           chat_format=FUNCTION_CALLING, verbose=False)


@pytest.mark.slow
def test_token_count_equals_llama_cpp_prompt_tokens_with_tools(llama, tokenizer):
    """tool_choice=auto: the first completion of the handler is the prompt as rendered.

    The usage that create_chat_completion returns under ``auto`` belongs to the
    follow-up completions (the prompt plus ``message:`` or a whole call), so the
    test reads the usage of the handler's first completion, the one on the bare
    prompt, and stops the handler there.
    """
    messages = EPISODE[:4]
    seen = []
    real = llama.create_completion

    def first_only(prompt, **kw):
        seen.append((prompt, real(prompt=prompt, **{**kw, "max_tokens": 1})))
        raise _Captured(prompt)

    llama.create_completion = first_only
    try:
        with pytest.raises(_Captured):
            llama.create_chat_completion(messages=server_messages(messages, FUNCTION_CALLING),
                                         tools=TOOLS, tool_choice="auto", max_tokens=1)
    finally:
        del llama.create_completion
    (prompt, completion), = seen
    ours = render_prompt(messages, TOOLS, "auto")
    assert prompt == ours
    ids = _ids(tokenizer, ours)
    assert completion["usage"]["prompt_tokens"] == len(ids)
    assert llama.tokenize(ours.encode(), add_bos=True, special=True) == ids


@pytest.mark.slow
def test_token_count_equals_llama_cpp_prompt_tokens_without_tools(llama, tokenizer):
    for messages, tools, choice in ((CHAT[:4], None, None), (EPISODE[:5], TOOLS, "none")):
        reply = llama.create_chat_completion(messages=server_messages(messages, FUNCTION_CALLING),
                                             tools=tools, tool_choice=choice, max_tokens=1)
        ours = render_prompt(messages, tools, "none")
        ids = _ids(tokenizer, ours)
        assert reply["usage"]["prompt_tokens"] == len(ids)
        assert llama.tokenize(ours.encode(), add_bos=True, special=True) == ids


@pytest.mark.slow
def test_the_shimmed_server_counts_the_prompt_tokens_we_render(served_gguf, free_port, tokenizer, tmp_path):
    """The real server through core.model.shim reads the unescaped prompt we render.

    Under ``auto`` the reply's usage sums the handler's follow-up completions:
    the prompt plus ``message:\\n``, or, per call, the prompt plus the calls
    before it (``functions.NAME:\\nARGS\\n`` each) and ``functions.NAME:\\n``.
    """
    call = {"id": "c1", "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "x<y \\"q\\".txt"}'}}
    messages = [*EPISODE[:2], {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": "x < y && z"}]
    with shim_server(served_gguf, free_port, tmp_path) as base:
        reply = httpx.post(f"{base}/chat/completions", timeout=120, trust_env=False, json={
            "messages": server_messages(messages, FUNCTION_CALLING), "tools": TOOLS,
            "tool_choice": "auto", "max_tokens": 1, "temperature": 0, "seed": 0}).json()
    ours = render_prompt(messages, TOOLS, "auto")
    assert '"path": "x<y \\"q\\".txt"' in ours and "&#34;" not in ours
    message = reply["choices"][0]["message"]
    if message.get("tool_calls"):
        prompts, done = [], ""
        for c in message["tool_calls"]:
            head = f"functions.{c['function']['name']}:\n"
            prompts.append(ours + done + head)
            done += head + c["function"]["arguments"] + "\n"
    else:
        prompts = [ours + "message:\n"]
    assert reply["usage"]["prompt_tokens"] == sum(len(_ids(tokenizer, p)) for p in prompts)


def test_a_text_answer_chosen_under_the_tool_list_trains_its_choice_in_the_tools_view(tokenizer):
    # Message 5 was the model's choice "message:" under the tool list (the auto request came
    # back as words); message 9 came from a request without tools (no choice made).
    messages = [dict(m) for m in EPISODE]
    messages[5]["choice"] = "message"
    row = {"messages": messages, "tools": TOOLS, "advantages": [None] * 5 + [0.5] + [None] * 4}
    tools_view, plain_view = render_row(row, tokenizer)
    assert tools_view.view == "tools" and plain_view.view == "plain"
    choice = tools_view.action_positions(5)
    # Both of the handler's choices: "message:", then the end rather than a call's head.
    assert tokenizer.decode([tools_view.ids[t] for t in choice]) == "message:<|im_end|>"
    # Its context is exactly what the auto request showed the model, and the choice is its
    # first generated tokens.
    # (Message 2's calls are rendered as generated, so compare from a row whose first
    # action is the choice.)
    assert tools_view.ids[:choice[0]][:50] == _ids(tokenizer, render_prompt(messages[:5], TOOLS,
                                                                             "auto"))[:50]
    first = [messages[0], messages[1], {**messages[5]}]
    seq = render_row({"messages": first, "tools": TOOLS, "advantages": [None, None, 1.0]},
                     tokenizer)[0]
    at = seq.action_positions(2)
    assert seq.ids[:at[0]] == _ids(tokenizer, render_prompt(first[:2], TOOLS, "auto"))
    assert "Both files are short." not in tokenizer.decode(seq.ids)  # the plain view's words
    # The handler's grammar forbids the end-of-generation token until the option is complete,
    # so the end is spelled out in plain tokens, and "<" is what was chosen over "functions".
    spelled = tokenizer("<|im_end|>", add_special_tokens=False, split_special_tokens=True)
    end = at[-len(spelled["input_ids"]):]
    assert [seq.ids[t] for t in end] == spelled["input_ids"]
    # ... on the handler's second prompt: the first plus "message:\n".
    assert seq.ids[:end[0]] == _ids(tokenizer, render_prompt(first[:2], TOOLS, "auto")
                                    + "message:\n")
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") not in [seq.ids[t] for t in at]
    assert tools_view.advantages == {5: 0.5}
    assert tokenizer.decode([tools_view.ids[t] for t in tools_view.action_positions(9)]) == ""
    # The words themselves are the plain view's action, as before.
    words = plain_view.action_positions(5)
    assert tokenizer.decode([plain_view.ids[t] for t in words]) == "Both files are short.<|im_end|>"


def test_a_demonstrated_tool_call_is_imitated_as_the_call_the_model_would_write(tokenizer):
    # A practice reference that shows its tool calls (bot.practice.demonstration): the call
    # and the answer after its result are both listed for imitation.
    answer = {**EPISODE[5], "choice": "message"}
    row = {"messages": [*EPISODE[:5], answer], "tools": TOOLS, "imitate": [2, 5]}
    tools_view, plain_view = render_row(row, tokenizer)
    assert tools_view.imitated == {2, 5} and plain_view.imitated == {5}
    imitated = tokenizer.decode([i for i, k, m in zip(tools_view.ids, tools_view.kinds,
                                                      tools_view.messages)
                                 if k == ACTION and m in tools_view.imitated])
    assert imitated.startswith('functions.read_file:{"path": "a.txt"}')
    assert imitated.endswith("message:<|im_end|>")
    # The tool's output stays an observation: shown, not imitated.
    assert _decode(tokenizer, tools_view, OBSERVATION, 3) == "x < y && z"


def test_the_tools_views_choices_are_its_heads_and_nothing_else(tokenizer):
    """heads (train.imitation_per = "choice"): each call's ``functions.NAME:`` and a text
    answer's ``message:`` and end under the tool list; never arguments, words or context."""
    answer = {**EPISODE[5], "choice": "message"}
    row = {"messages": [*EPISODE[:5], answer], "tools": TOOLS}
    tools_view, plain_view = render_row(row, tokenizer)
    heads = sorted(tools_view.heads)
    assert tokenizer.decode([tools_view.ids[t] for t in heads]) == (
        "functions.read_file:functions.read_file:message:<|im_end|>")
    assert all(tools_view.kinds[t] == ACTION for t in heads)
    assert plain_view.heads == set()  # no choice without the tool list
    inside = tools_view.action_positions(5)[1]  # cut inside the answer: it no longer counts
    calls = {t for t in heads if tools_view.messages[t] == 2}
    assert calls and truncate(tools_view, inside).heads == calls
