"""The paired gate: its three outcomes on planted before/after answers, its items, and
that it renders a request exactly as the agent does.

The decision tests plant each model's answers and a judge that scores by the
answer's text, so every figure can be checked by hand. The slow test at the
end answers through the real llama.cpp model and scores the open chat through
an HTTP judge.
"""

from __future__ import annotations

import json

import pytest

from bot.admin import write_agent_view
from core.storage.store import Store
from tests.discord_helpers import make_config, start_runtime
from tests.judge_server import JudgeServer
from tests.scripted import ScriptedLLM, say
from trainer.client import JsonClient
from trainer.gate import (
    GateSettings,
    collapsed,
    decide,
    opening,
    paired_interval,
    run_gate,
)
from trainer.gate_items import (
    OPEN_PROMPTS,
    AgentView,
    Item,
    agent_view,
    ask_like_agent,
    eval_items,
    heldout_items,
    read_items,
    score_check,
)
from trainer.gate_side import Side, generate, measure_model, score_side
from trainer.loops import repetition

SETTINGS = GateSettings(margin=0.05, regression_margin=0.5, min_items=20)
FINE_CHAT = [f"a plain answer number {i}" for i in range(len(OPEN_PROMPTS))]


class PlantedJudge:
    """Scores an answer by its text: "good ..." 2, "bad ..." -2, anything else 1."""

    def __init__(self) -> None:
        self.requests = 0

    async def ask(self, messages, schema, max_tokens, name="answer", temperature=0.0):
        self.requests += 1
        answer = messages[-1]["content"].split("Answer: ", 1)[1]
        score = 2 if answer.startswith("good") else -2 if answer.startswith("bad") else 1
        return {"score": score}, json.dumps({"score": score})


def arithmetic(n: int) -> list[Item]:
    return [Item(f"add:{i}", f"What is {i} + {i}? Answer with the number only.",
                 {"exact": str(2 * i)}) for i in range(n)]


def answers(items: list[Item], right: set[int]) -> list[str]:
    return [i.check["exact"] if k in right else "I am not sure" for k, i in enumerate(items)]


async def sides(items, before_right, after_right, after_chat=FINE_CHAT, before_chat=FINE_CHAT):
    judge = PlantedJudge()
    before = await score_side(judge, items, answers(items, before_right), before_chat)
    after = await score_side(judge, items, answers(items, after_right), after_chat)
    return before, after


async def test_a_clear_per_item_gain_on_enough_items_promotes():
    items = arithmetic(30)
    before, after = await sides(items, set(range(10)), set(range(28)))
    report = decide(before, after, SETTINGS)
    assert report.outcome == "promote" and report.passed
    assert report.n == 30 and report.gain == pytest.approx(18 / 30)
    assert report.lower >= 0.05 and "lower end reaches the margin" in report.reasons[0]


async def test_a_candidate_that_got_worse_is_rejected():
    items = arithmetic(30)
    before, after = await sides(items, set(range(20)), set(range(3)))
    report = decide(before, after, SETTINGS)
    assert report.outcome == "reject" and not report.passed
    assert report.gain == pytest.approx(-17 / 30) and report.upper < 0.05
    assert "lies below the margin" in report.reasons[0]


async def test_too_few_items_is_inconclusive_however_large_the_gain():
    items = arithmetic(5)
    before, after = await sides(items, set(), set(range(5)))
    report = decide(before, after, SETTINGS)
    assert report.outcome == "inconclusive" and report.gain == 1.0
    assert "too few items; the gate needs at least 20" in report.reasons[0]


async def test_one_flipped_answer_among_many_is_inconclusive_not_a_promotion():
    # Two answers newly right, one newly wrong: mean +1/30; the interval straddles the margin.
    items = arithmetic(30)
    before, after = await sides(items, set(range(10)), set(range(12)) - {5})
    report = decide(before, after, SETTINGS)
    assert report.outcome == "inconclusive", report.reasons
    assert report.gain == pytest.approx(1 / 30)
    assert report.lower < 0.05 <= report.upper and "includes the margin" in report.reasons[0]


async def test_a_loop_that_moves_to_another_prompt_is_no_regression_but_is_kept():
    # The base loops on #1; the candidate frees #1 and loops on #0: as many loops as before.
    items = arithmetic(30)
    loop = "go on " * 30
    before, after = await sides(items, set(range(10)), set(range(28)),
                                after_chat=[loop] + FINE_CHAT[1:],
                                before_chat=FINE_CHAT[:1] + [loop] + FINE_CHAT[2:])
    report = decide(before, after, SETTINGS)
    assert report.outcome == "promote", report.reasons
    assert [r["prompt"] for r in report.open_regressed] == [0]
    assert report.reasons[-1] == ("open chat: a loop moved to prompts [0] (1 of 22 answers "
                                  "loop, 1 before)")
    # One loop more than before is a regression, whichever prompts they are on.
    after_two = [loop, loop] + FINE_CHAT[2:]
    before, after = await sides(items, set(range(10)), set(range(28)), after_chat=after_two,
                                before_chat=FINE_CHAT[:1] + [loop] + FINE_CHAT[2:])
    report = decide(before, after, SETTINGS)
    assert report.outcome == "reject" and "2 of 22 answers loop, 1 before" in report.reasons[0]


async def test_open_chat_turning_degenerate_rejects_even_a_clear_gain():
    items = arithmetic(30)
    looping = ["go on " * 30] + FINE_CHAT[1:]
    before, after = await sides(items, set(range(10)), set(range(28)), after_chat=looping)
    report = decide(before, after, SETTINGS)
    assert report.outcome == "reject" and "prompts [0] turned degenerate" in report.reasons[0]
    assert "1 of 22 answers loop, 0 before" in report.reasons[0]
    assert 'e.g. #0: "go on go on' in report.reasons[0] and report.reasons[0].endswith('..."')
    # The answers are kept with the report, so a rejected night can be read.
    assert report.as_dict()["open_regressed"] == [
        {"prompt": 0, "request": OPEN_PROMPTS[0], "before": FINE_CHAT[0], "after": looping[0]}]


async def test_open_chat_judged_much_worse_rejects():
    items = arithmetic(30)
    worse = ["bad answer"] * len(OPEN_PROMPTS)
    before, after = await sides(items, set(range(10)), set(range(28)), after_chat=worse)
    report = decide(before, after, SETTINGS)
    assert report.outcome == "reject"
    assert any("judged score fell from 0.50 to -1.00" in r for r in report.reasons)


# Answers of the base model and of a night that imitated bracketed protocol answers
# (bench/learning.py, one kept day): the judge scored both alike.
BASE_CHAT = [f"Answer {i}: " + " ".join(f"w{j}" for j in range(i + 3)) + "."
             for i in range(len(OPEN_PROMPTS))]
BRACKETED = {0: "[|im_end|]", 4: "[RED]", 6: "[Frozen]", 7: "[Français]",
             11: "[HTML]\n\nI'm a text-based language-processing tool.", 13: "[SIN]"}


async def test_open_chat_collapsing_onto_one_shape_rejects_though_the_judge_is_blind():
    items = arithmetic(30)
    after_chat = [BRACKETED.get(i, a) for i, a in enumerate(BASE_CHAT)]
    before, after = await sides(items, set(range(10)), set(range(28)), after_chat=after_chat,
                                before_chat=BASE_CHAT)
    report = decide(before, after, SETTINGS)
    assert report.outcome == "reject"
    [reason] = report.reasons
    assert reason.startswith("open chat collapsed: 5 of 22 answers newly open as '[a]' "
                             "(prompts [4, 6, 7, 11, 13])") and '"[RED]"' in reason
    assert [r["prompt"] for r in report.open_regressed] == [4, 6, 7, 11, 13]


def test_a_few_answers_sharing_a_shape_is_not_a_collapse():
    before = [f"Sentence {i} " + "w " * i for i in range(22)]
    numbers = ["56", "6", "100"]  # the sums and the boiling point answered bare
    assert collapsed(before, numbers + before[3:]) is None
    assert collapsed(before, ["[A]", "[B]", "[C]", "[D]"] + before[4:]) == ("[a]", [0, 1, 2, 3])
    assert opening("  [Français]\nmore") == "[a]" and opening("-12.5 days") == "-9.9 a"
    # Tool calls open with their tool: write_file for 2 open prompts before, 7 after; the
    # 5 new ones count, prompt by prompt.
    calls = [f'write_file {{"content": "{i}", "path": "x{i}"}}' for i in range(7)]
    assert opening(calls[0]) == "write_file {...}"
    assert collapsed(calls[:2] + before[2:], calls + before[7:]) == ("write_file {...}",
                                                                    [2, 3, 4, 5, 6])
    calls += [f'write_file {{"content": "{i}"}}' for i in range(7, 9)]
    swapped = before[:4] + calls[4:9] + before[9:]  # 4 calls stop, 5 others start
    assert collapsed(calls[:4] + before[4:], swapped) == ("write_file {...}", [4, 5, 6, 7, 8])
    # Terse words or empty answers are not a format: the other checks see them.
    assert collapsed(before, ["Red.", "Paris.", "Modern.", "Smokey.", "Yes!"] + before[5:]) is None
    assert collapsed(before, [""] * 6 + before[6:]) is None


async def test_judged_eval_items_are_paired_on_the_zero_to_one_scale():
    items = [Item(f"episode:{i}", f"request {i}", None) for i in range(3)]
    judge = PlantedJudge()
    side = await score_side(judge, items, ["good", "bad", "meh"], FINE_CHAT)
    assert side.scores == {"episode:0": 1.0, "episode:1": 0.0, "episode:2": 0.75}


def test_the_open_chat_check_has_at_least_twenty_distinct_prompts():
    assert len(set(OPEN_PROMPTS)) >= 20


def test_the_paired_bootstrap_is_seeded_and_exact_on_constant_differences():
    assert paired_interval([0.5] * 10, SETTINGS) == (0.5, 0.5, 0.5)
    diffs = [1, 0, 0, -1, 1, 1, 0, 0, 1, 0]
    assert paired_interval(diffs, SETTINGS) == paired_interval(diffs, SETTINGS)
    mean, lower, upper = paired_interval(diffs, SETTINGS)
    assert mean == pytest.approx(0.3) and lower < 0.3 < upper


def test_checks_score_exact_regex_and_leave_unknown_kinds_unscored():
    assert score_check({"exact": "42"}, " 42\n") == 1.0
    assert score_check({"exact": "42"}, "42.") == 0.0
    assert score_check({"regex": r"\bget_weather\b"}, 'get_weather {"city": "Oslo"}') == 1.0
    assert score_check({"contains": "Paris"}, "It is  paris.") == 1.0
    assert score_check({"python": "check.py"}, "anything") is None


def test_held_out_items_come_from_the_heldout_folder_and_the_jobs_inputs(tmp_path):
    config = make_config(tmp_path)
    folder = config.data_dir / "heldout"
    folder.mkdir(parents=True)
    (folder / "arith.jsonl").write_text(
        '{"id": "a1", "prompt": "2+2?", "check": {"exact": "4"}}\n\n')
    extra = tmp_path / "extra.jsonl"
    extra.write_text('{"prompt": "hi", "check": {"regex": "h"}}\n')
    items = heldout_items(config, {"heldout": [str(extra)]})
    assert [(i.id, i.request, i.check) for i in items] == [
        ("a1", "2+2?", {"exact": "4"}), ("extra:1", "hi", {"regex": "h"})]
    (folder / "bad.jsonl").write_text('{"prompt": "no check"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a \{prompt, check\} item"):
        read_items(folder / "bad.jsonl")


def test_eval_items_are_the_first_request_of_held_out_episodes():
    rows = [{"kind": "episode", "split": "eval", "episode_id": 4, "messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]},
        {"kind": "episode", "split": "train", "messages": [{"role": "user", "content": "t"}]},
        {"kind": "value_prediction", "split": "train", "messages": []}]
    assert eval_items(rows, 10) == [Item("episode:4", "q1", None, "eval")]


class FakeLlama:
    """Answers as chatml-function-calling does: empty under ``auto`` unless it calls."""

    def __init__(self, call: bool, overflow: bool = False) -> None:
        self.call, self.overflow, self.requests = call, overflow, []

    def create_chat_completion(self, **params):
        self.requests.append(params)
        if self.overflow:
            raise ValueError("Requested tokens (8193) exceed context window of 8192")
        if self.call:
            message = {"content": None, "tool_calls": [{"function": {
                "name": "get_time", "arguments": '{"zone": "UTC"}'}}]}
        elif params.get("tool_choice") == "auto":
            message = {"content": ""}
        else:
            message = {"content": "It is noon."}
        return {"choices": [{"message": message}]}


def test_the_gate_asks_like_the_agents_client():
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    requests = [AgentView("sys", tools).render("time?"), AgentView("sys", tools).render("hi")]
    words = FakeLlama(call=False)
    assert ask_like_agent(words, requests, tools, "chatml-function-calling", 64) == \
        ["It is noon.", "It is noon."]
    # Every "auto" request first (they share the tool-list prefix), then the retries.
    assert [r["tool_choice"] for r in words.requests] == ["auto", "auto", "none", "none"]
    assert words.requests[0]["tools"] == tools and words.requests[0]["temperature"] == 0
    assert words.requests[2]["messages"] == requests[0]
    calling = FakeLlama(call=True)
    assert ask_like_agent(calling, requests[:1], tools, "chatml-function-calling", 64) == \
        ['get_time {"zone": "UTC"}']
    assert [r["tool_choice"] for r in calling.requests] == ["auto"]
    # A call whose arguments never end overflows the context: an empty answer, no retry.
    endless = FakeLlama(call=True, overflow=True)
    assert ask_like_agent(endless, requests[:1], tools, "chatml-function-calling", 64) == [""]
    assert len(endless.requests) == 1


class HeadLlama:
    """Writes a bare call head as its words under ``auto`` (seen after a night), and the
    call when the tool is named."""

    def __init__(self, head: str) -> None:
        self.head, self.requests = head, []

    def create_chat_completion(self, **params):
        self.requests.append(params)
        if isinstance(params.get("tool_choice"), dict):
            name = params["tool_choice"]["function"]["name"]
            message = {"content": None, "tool_calls": [{"function": {
                "name": name, "arguments": '{"zone": "UTC"}'}}]}
        else:
            message = {"content": self.head}
        return {"choices": [{"message": message}]}


def test_the_gate_asks_a_bare_call_head_again_as_the_tool_it_names():
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    requests = [AgentView("sys", tools).render("time?")]
    head = HeadLlama("functions.get_time:")
    assert ask_like_agent(head, requests, tools, "chatml-function-calling", 64) == \
        ['get_time {"zone": "UTC"}']
    assert head.requests[1]["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    # A head naming a tool not offered is an answer in words, as the agent's client keeps it.
    other = HeadLlama("functions.rm_rf:")
    assert ask_like_agent(other, requests, tools, "chatml-function-calling", 64) == \
        ["functions.rm_rf:"]
    assert len(other.requests) == 1


async def test_the_gate_renders_a_request_exactly_as_the_agent_sends_it(tmp_path):
    config = make_config(tmp_path)
    llm = ScriptedLLM([say("4")])
    rt = await start_runtime(config, llm)
    try:
        await rt.turn("fresh-channel", "What is 2 + 2?")
        sent_messages, sent = llm.calls[0]
        view = await agent_view(config, rt.store, {"agent_view": str(write_agent_view(rt.agent, rt.config.data_dir))})
        assert view.render("What is 2 + 2?") == sent_messages
        assert view.tools == sent["tools"] and len(view.tools) >= 30
        # A night started from the command line has no view file: the config's system
        # prompt and the tool list of the newest stored system step give the same.
        fallback = await agent_view(config, rt.store, {})
        assert fallback.render("What is 2 + 2?") == sent_messages
        assert fallback.tools == sent["tools"]
    finally:
        await rt.close()


def test_repetition_measures_looping_text():
    assert repetition("the cat sat on the mat and looked at the dog") == 0.0
    assert repetition("go go go go " * 20) > 0.9


# -- through the real model ----------------------------------------------------------------


@pytest.mark.slow
def test_the_real_model_answers_with_the_agents_tools_through_llama_cpp(served_gguf):
    tools = [{"type": "function", "function": {
        "name": "get_time", "description": "The current time in a time zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                       "required": ["zone"]}}}]
    view = AgentView("You are a helpful assistant.", tools)
    [answer] = generate(served_gguf, ["What time is it in UTC?"], view,
                        "chatml-function-calling", 48, 2048)
    assert answer.strip()  # words, or a "get_time {...}" line


@pytest.mark.slow
async def test_the_same_model_before_and_after_is_rejected_through_the_real_path(
        tmp_path, served_gguf):
    judge = await JudgeServer(lambda kind, body: {"score": 1}).start()
    try:
        config = make_config(tmp_path)
        config.server.kind, config.server.endpoint = "external", judge.url
        config.night.gate_min_items = 4
        view = config.data_dir / "view.json"
        view.parent.mkdir(parents=True)
        view.write_text(json.dumps({"system": "Answer with the number only.", "tools": []}))
        heldout = tmp_path / "heldout.jsonl"
        heldout.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i} + 1?",
                                               "check": {"exact": str(i + 1)}}) + "\n"
                                   for i in range(4)))
        args = {"agent_view": str(view), "heldout": [str(heldout)]}
        async with await Store.open(config.store_path) as store:
            report = await run_gate(config, store, [], args, (served_gguf, None),
                                    (served_gguf, None))
            judged = len(judge.of("gate_score"))
            # The night measures the live side before it trains and keeps it in its
            # progress (JSON); the gate then measures only the candidate.
            kept = json.loads(json.dumps(
                (await measure_model(config, store, [], args, (served_gguf, None))).kept()))
            again = await run_gate(config, store, [], args, (served_gguf, None),
                                   (served_gguf, None), measured=Side(**kept))
            judged_again = len(judge.of("gate_score"))
            # A side that answered other items (a practice set changed meanwhile) is asked
            # again: both sides are answered here.
            del kept["scores"]["q0"]
            fresh = await run_gate(config, store, [], args, (served_gguf, None),
                                   (served_gguf, None), measured=Side(**kept))
    finally:
        await judge.stop()
    # Greedy answers of one model are the same twice: no gain, so it cannot reach the margin.
    assert report.n == 4 and report.gain == 0.0 and report.outcome == "reject"
    assert judged == 2 * len(OPEN_PROMPTS)
    assert judged_again == 4 * len(OPEN_PROMPTS) and not kept["answers"]
    assert len(judge.of("gate_score")) == 6 * len(OPEN_PROMPTS)
    assert again.items == fresh.items == report.items and again.outcome == "reject"
    assert (again.open_before, again.open_after) == (report.open_before, report.open_after)
    # The night report's per-family figures: the set's file name is the family.
    family = report.families["heldout"]
    assert family["n"] == 4 and family["before"] == family["after"]
    assert report.as_dict()["families"] == report.families
