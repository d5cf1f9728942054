"""The value model: predicted reward and length of a sub-task, from memory.

Memory is a chromadb collection of past sub-tasks (description, reward, length,
date) embedded with the same offline all-MiniLM-L6-v2 as the notes. For a new
sub-task we retrieve the k nearest past ones and weight each by

    weight = similarity * 0.5 ** (age_days / half_life_days)

then give the weighted memory to the served model, which answers its
prediction (score -2..2, length) under a JSON schema. Advantages
(``trainer.rewards.task_advantages``):

    A_reward = r - r_hat          A_length = -(len - len_hat) / length_scale

The memory is updated once, in one batch, after the night's training has
succeeded (``trainer.night.remember``): no sub-task of this night can influence
another's prediction, and a night run again after a failure never retrieves
its own answers. ``nearest`` also leaves out the memories of the night asking.

Each memory names the episodes its description came from (``episodes`` metadata,
``core.storage.copies``), and a prediction the episodes of its sub-task and of the
memories it was shown: ``/forget`` of one of them deletes the memory (``forget``) and the
rows and ledger records made from it.

The prediction texts become training sequences too, with
reward = -(|r - r_hat| / 2 + |len - len_hat| / max(len, len_hat)) / 2, in [-1, 0],
so the value estimate improves with the policy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from core.storage.copies import episodes_meta, meta_episodes, stale_memories
from trainer.client import JsonClient
from trainer.judge import SubTask

VALUE_SYSTEM = (
    "You predict how well an AI assistant will do a task, from how it did on similar past "
    "tasks. Score: 2 = done well ... -2 = failed. Length: how many assistant turns it takes. "
    "Answer only with JSON."
)
SCHEMA = {"type": "object", "properties": {
    "score": {"enum": [-2, -1, 0, 1, 2]},
    "length": {"enum": list(range(1, 21))}},
    "required": ["score", "length"]}
_DAY = 86400.0


@dataclass
class Prediction:
    key: str
    reward: float
    length: float
    prompt: list[dict]
    answer: str
    neighbours: int
    episodes: list[int] = field(default_factory=list)  # whose text its prompt holds


class ValueMemory:
    """Past sub-tasks in a chromadb collection."""

    def __init__(self, path: Path, embedder, name: str = "value-memory") -> None:
        import chromadb

        self.client = chromadb.PersistentClient(path=str(path))
        self.collection = self.client.get_or_create_collection(
            name, embedding_function=embedder, metadata={"hnsw:space": "cosine"})

    def nearest(self, description: str, k: int, now: float, half_life_days: float,
                exclude_night: int | None = None) -> list[dict]:
        """The k nearest memories (none of night ``exclude_night``), heaviest first."""
        count = self.collection.count()
        if count == 0:
            return []
        where = None if exclude_night is None else {"night": {"$ne": exclude_night}}
        found = self.collection.query(query_texts=[description], n_results=min(k, count),
                                      where=where, include=["documents", "metadatas", "distances"])
        out = []
        for text, meta, distance in zip(found["documents"][0], found["metadatas"][0],
                                        found["distances"][0]):
            similarity = max(0.0, 1.0 - float(distance))
            age_days = max(0.0, now - float(meta["date"])) / _DAY
            weight = similarity * 0.5 ** (age_days / half_life_days)
            out.append({"description": text, "reward": float(meta["reward"]),
                        "length": int(meta["length"]), "age_days": age_days,
                        "similarity": similarity, "weight": weight,
                        "episodes": sorted(meta_episodes(meta) or ())})
        return sorted(out, key=lambda m: -m["weight"])

    def add_batch(self, subtasks: list[SubTask], night_id: int, now: float) -> None:
        """The night's one memory update (idempotent: ids are the night and the key)."""
        if not subtasks:
            return
        self.collection.upsert(
            ids=[f"{night_id}:{s.key}" for s in subtasks],
            documents=[s.description for s in subtasks],
            metadatas=[{"reward": s.reward, "length": s.length, "date": now, "channel": s.channel,
                        "night": night_id, "source": s.source,
                        "episodes": episodes_meta(s.episodes)} for s in subtasks])

    def forget(self, forgotten: dict[int, str]) -> int:
        """Delete the memories made from forgotten episodes (id -> channel); how many."""
        stale = stale_memories(self.collection, forgotten)
        if stale:
            self.collection.delete(ids=stale)
        return len(stale)

    def count(self) -> int:
        return self.collection.count()


def value_prompt(subtask: SubTask, memory: list[dict]) -> list[dict]:
    if memory:
        lines = [f"- (weight {m['weight']:.2f}) {m['description']!r}: score {round(m['reward'] * 2)}, "
                 f"{m['length']} turns, {m['age_days']:.0f} days ago" for m in memory]
        past = "Similar past tasks, most relevant first:\n" + "\n".join(lines)
    else:
        past = "There are no similar past tasks yet."
    return [{"role": "system", "content": VALUE_SYSTEM},
            {"role": "user", "content": f"{past}\n\nNew task: {subtask.description!r}\n"
                                        "Predict its score and length."}]


async def predict(client: JsonClient, memory: ValueMemory, subtask: SubTask, k: int,
                  half_life_days: float, now: float | None = None,
                  attempts: int = 3, exclude_night: int | None = None) -> Prediction | None:
    """The model's prediction for one sub-task, or None when no valid answer came."""
    now = time.time() if now is None else now
    neighbours = memory.nearest(subtask.description, k, now, half_life_days, exclude_night)
    prompt = value_prompt(subtask, neighbours)
    for attempt in range(attempts):  # greedy first; retries sample
        answer, raw = await client.ask(prompt, SCHEMA, 32, "value_prediction",
                                       temperature=0.0 if attempt == 0 else 0.7)
        if isinstance(answer, dict) and answer.get("score") in (-2, -1, 0, 1, 2) \
                and isinstance(answer.get("length"), int) and answer["length"] >= 1:
            shown = set(subtask.episodes).union(*(m["episodes"] for m in neighbours))
            return Prediction(subtask.key, answer["score"] / 2, float(answer["length"]),
                              prompt, raw, len(neighbours), sorted(shown))
    return None


def prediction_reward(subtask: SubTask, prediction: Prediction) -> float:
    """-(normalised error) in [-1, 0]: the value model's own training signal."""
    reward_error = abs(subtask.reward - prediction.reward) / 2
    length_error = abs(subtask.length - prediction.length) / max(subtask.length, prediction.length)
    return -(reward_error + length_error) / 2
