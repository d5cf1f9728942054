"""Anchors: the live model's own answers to general requests, held where they are.

A demonstration (a practice task's reference, ``trainer.advantages``) is imitated:
trained by likelihood on text the model did not write. Nothing in it says where its
format belongs, and the embedded model carries it everywhere: after a night that
imitated the protocol family's ``[WORD]`` answers, 8 of the gate's 22 open-chat
prompts were answered in brackets (bench/learning.py, one kept day). OAPL's rows are
held by their KL to pi_lag; imitation has no such term.

So a night that imitates also trains the live model's own greedy answers to a fixed
set of general requests, asked as the agent asks them (its system prompt and tools),
at advantage 0: OAPL's term is then (beta * log(pi / pi_lag))^2 alone, which holds
those answers where they are while the references move the practised prompts.
Holding the practised prompts' own failed attempts instead competes with the
reference on the very prompt it teaches (README "Measuring it").

The requests are general chat, like the gate's open-chat prompts but none of them
(``trainer.gate_items.OPEN_PROMPTS`` measures what these hold). An answer that is a
tool call, empty, cut at the token limit or repetitive is not held.
"""

from __future__ import annotations

from trainer.gate import repetition
from trainer.gate_items import OPEN_PROMPTS, AgentView

ANCHOR_PROMPTS = [
    "Introduce yourself in one sentence.",
    "What is 6 plus 5?",
    "Give me two tips for staying focused while working.",
    "What is a calendar used for? One sentence.",
    "Name an animal that lives in the sea.",
    "Explain what a backup is, briefly.",
    "Suggest a title for a short story about a lighthouse.",
    "What is the capital of Italy?",
    "Write one line about the morning sun.",
    "How many hours are there in a day?",
    "Why is drinking water important? Two sentences.",
    "What does CPU stand for?",
    "Give one idea for a relaxing weekend activity.",
    "Translate 'good morning' into French.",
    "What is the opposite of 'heavy'?",
    "Tell me something interesting about the moon.",
]
assert not set(ANCHOR_PROMPTS) & set(OPEN_PROMPTS)
# An anchor's answer is generated whole: its end is trained too.
ANCHOR_MAX_TOKENS = 192


def imitates(rows: list[dict]) -> bool:
    """Whether the night trains any demonstration (what anchors are for)."""
    return any(r.get("imitate") and r.get("split") == "train" for r in rows)


def anchor_rows(requests: list[str], replies: list[dict], view: AgentView) -> list[dict]:
    """Training rows holding each whole worded reply to its request at advantage 0."""
    rows = []
    for request, reply in zip(requests, replies):
        content = reply.get("content") or ""
        if reply.get("tool_calls") or not content.strip() or reply.get("error") \
                or reply.get("finish_reason") == "length" or repetition(content) > 0.5:
            continue
        answer = {"role": "assistant", "content": content}
        if view.tools:
            answer["choice"] = "message"  # it chose words under the tool list (trainer.tokens)
        rows.append({"kind": "anchor", "episode_id": None, "channel": "", "split": "train",
                     "tools": list(view.tools), "messages": [*view.render(request), answer],
                     "advantages": [None, None, 0.0], "token_overrides": [], "harness": [],
                     "imitate": [], "labels": [], "request": request})
    return rows
