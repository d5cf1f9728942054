"""The understanding pass: did the agent understand the task, and the user the answer?

A seeded share of episodes (``night.understanding_fraction``, 30% by default)
gets a second judge pass under a JSON schema. Each question is scored -2..2;
the episode's understanding advantage is their mean / 2, in [-1, 1], and is
averaged with the task advantages of its messages. The sample is a hash of the
seed and the episode id, so a resumed night samples the same episodes.
"""

from __future__ import annotations

import hashlib

from core.storage.store import Episode
from trainer.client import JsonClient
from trainer.judge import Message, render

UNDERSTANDING_SYSTEM = (
    "You read a conversation between a user and an AI assistant. Score two things from -2 "
    "(not at all) to 2 (fully): did the assistant understand what the user wanted, and did the "
    "user understand the assistant's answer (judge from the user's reactions; 0 if unknown)? "
    "Answer only with JSON."
)
SCHEMA = {"type": "object", "properties": {
    "agent_understood": {"enum": [-2, -1, 0, 1, 2]},
    "user_understood": {"enum": [-2, -1, 0, 1, 2]}},
    "required": ["agent_understood", "user_understood"]}


def sampled(episode_id: int, fraction: float, seed: int) -> bool:
    digest = hashlib.sha256(f"understanding:{seed}:{episode_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < fraction


async def understanding_score(client: JsonClient, episode: Episode, attempts: int = 3) -> float | None:
    """The episode's understanding advantage in [-1, 1], or None when no valid answer came."""
    messages = [Message(i, episode.id, s.id, s.role, s.content or "", s.tool_calls)
                for i, s in enumerate(s for s in episode.steps if s.role != "system")]
    prompt = [{"role": "system", "content": UNDERSTANDING_SYSTEM},
              {"role": "user", "content": render(messages, 0, len(messages))}]
    for attempt in range(attempts):  # greedy first; retries sample
        answer, _raw = await client.ask(prompt, SCHEMA, 48, "understanding",
                                        temperature=0.0 if attempt == 0 else 0.7)
        if isinstance(answer, dict) and answer.get("agent_understood") in (-2, -1, 0, 1, 2) \
                and answer.get("user_understood") in (-2, -1, 0, 1, 2):
            return (answer["agent_understood"] + answer["user_understood"]) / 4
    return None
