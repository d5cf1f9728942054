"""Collect: the episodes a night may learn from, split and accounted for.

An episode is excluded, and counted by reason, when it is incomplete (still
open, or a cancelled turn), errored (a harness error), its check failed to
run (``check-failed``: see ``trainer.rewards``; unless a person labelled it),
or it holds a secret. Everything else is learnt from: a ``rejected`` episode
is a negative example, and an ``aborted`` one (the agent hit the step limit)
a failure with a negative reward. The train/eval split is a hash of the
episode id, so it never changes between nights; an episode a check rewarded
always trains (practice sets hold their own items out for the gate). The manifest records every
row's hash and the counts, so a night's data can be audited and compared later.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from core.storage.events import Event
from core.storage.store import Episode, Store
from trainer.rewards import VerifierReward, person_reward, verifier_rewards
from trainer.secrets import SecretScanner

EXCLUDED_STATUS = {"open": "incomplete", "errored": "errored"}
ANY_RELEASE = object()  # collect's default: episodes served by any release


@dataclass
class Collection:
    since: float
    episodes: list[Episode]
    split: dict[int, str]  # episode id -> "train" | "eval"
    excluded: Counter = field(default_factory=Counter)
    verified: dict[int, VerifierReward] = field(default_factory=dict)  # stored check results

    def of_split(self, name: str) -> list[Episode]:
        return [e for e in self.episodes if self.split[e.id] == name]


def split_of(episode_id: int, eval_percent: int) -> str:
    digest = hashlib.sha256(f"nightshift-split:{episode_id}".encode()).digest()
    return "eval" if int.from_bytes(digest[:4], "big") % 100 < eval_percent else "train"


def episode_text(episode: Episode) -> str:
    parts = []
    for step in episode.steps:
        parts.append(step.content or "")
        if step.tool_calls:
            parts.append(json.dumps(step.tool_calls))
    return "\n".join(parts)


def exclusion(episode: Episode, scanner: SecretScanner,
              verified: VerifierReward | None = None) -> str | None:
    """Why an episode may not be trained on, or None."""
    if episode.forgotten_at is not None:  # /forget: its text is erased already
        return "forgotten"
    if episode.status in EXCLUDED_STATUS:
        return EXCLUDED_STATUS[episode.status]
    if verified is not None and verified.reward is None and person_reward(episode.labels) is None:
        return "check-failed"
    if scanner.has_secret(episode_text(episode)):
        return "secret"
    if not any(s.role == "assistant" for s in episode.steps):
        return "no-assistant-message"
    return None


async def last_night_end(store: Store) -> float:
    """When the last finished night started collecting; 0 before the first night."""
    done = [j for j in await store.jobs("sleep") if j["state"] in ("done", "live",
                                                                   "awaiting_promotion")]
    return max((j["progress"].get("collected_until", 0.0) for j in done), default=0.0)


async def collect(store: Store, scanner: SecretScanner, eval_percent: int,
                  since: float | None = None, until: float | None = None,
                  release: object = ANY_RELEASE) -> Collection:
    """Eligible episodes since ``since`` (default: the end of the last night).

    ``release``: the release id whose episodes to keep (None: the base model). π_lag is
    the model a night trains from, so an episode another release served is off-policy:
    it is excluded as ``other-release`` (counted, and kept in the store)."""
    since = await last_night_end(store) if since is None else since
    until = time.time() if until is None else until
    episodes = [e for e in await store.episodes_since(since) if e.started_at <= until]
    # A check's event comes after its episode ended, so after ``since`` too.
    verified = verifier_rewards(await store.events(Event.VERIFIER_REWARD, since))
    kept, excluded = [], Counter()
    for episode in episodes:
        reason = exclusion(episode, scanner, verified.get(episode.id))
        if reason is None and release is not ANY_RELEASE and episode.release_id != release:
            reason = "other-release"
        if reason:
            excluded[reason] += 1
        else:
            kept.append(episode)
    # A checked attempt (practice) always trains: its set holds its own items out for the
    # gate, and an eval share of a task's group would drop its example or its baseline.
    split = {e.id: "train" if e.id in verified and verified[e.id].reward is not None
             else split_of(e.id, eval_percent) for e in kept}
    return Collection(since, kept, split, excluded,
                      {e.id: verified[e.id] for e in kept if e.id in verified})


def row_hash(row: dict) -> str:
    canonical = json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def write_manifest(path: Path, collection: Collection, rows: list[dict],
                   extra: dict | None = None) -> dict:
    """The dataset manifest: counts, ``extra`` (the night's reward sources and judge
    agreement) and one hash per training row (atomically written)."""
    manifest = {
        **(extra or {}),
        "created_at": time.time(),
        "since": collection.since,
        "counts": {
            "eligible": len(collection.episodes),
            "train": len(collection.of_split("train")),
            "eval": len(collection.of_split("eval")),
            "excluded": dict(collection.excluded),
            "rows": len(rows),
        },
        "rows": [{"kind": r["kind"], "episode_id": r.get("episode_id"), "split": r["split"],
                  "sha256": row_hash(r)} for r in rows],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(manifest, indent=1))
    os.replace(partial, path)
    return manifest
