"""Degenerate repetition: one measure for the gate and for the night's rewards.

The gate rejects a release whose open-chat answers loop more often than the
model's before it; the night must not teach that loop in the first place. A
check sees an attempt's outcome, not its text, so a ``write_file`` whose content
repeats one sentence until the token limit can score as "the right file,
the wrong content" and rise above peers that wrote no file. Both sides read a
reply the same way (``reply_text``: its words, or its calls as ``name {args}``) and
call it a loop by the same threshold.
"""

from __future__ import annotations

LOOP_SHARE = 0.5  # share of repeated word 4-grams above which a reply is a loop


def repetition(text: str, n: int = 4) -> float:
    """Share of word n-grams that repeat an earlier one: near 1 for a loop."""
    words = text.replace("\\n", " ").split()  # a call's JSON arguments escape their newlines
    grams = [tuple(words[i:i + n]) for i in range(max(0, len(words) - n + 1))]
    return 0.0 if len(grams) < 4 else 1 - len(set(grams)) / len(grams)


def reply_text(message: dict) -> str:
    """A reply's words, or its tool calls as ``name {args}`` lines."""
    calls = message.get("tool_calls") or []
    if calls:
        return "\n".join(f"{c['function']['name']} {c['function'].get('arguments') or '{}'}"
                         for c in calls)
    return message.get("content") or ""


def loops(text: str) -> bool:
    return repetition(text) > LOOP_SHARE
