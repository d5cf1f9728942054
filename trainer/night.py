"""The night, part 1: from a stored day to advantages and a training set.

    collect -> judge (windows, blind) -> rewards by precedence -> value (predict
            each sub-task) -> understand -> advantages (store table + JSONL + manifest)

Each episode's row is rendered from the prompts its steps were sent (``trainer.context``:
the stored prefix, then the episode), or from its own messages where none is stored.

Rewards (``trainer.rewards``): a stored check's reward or a person's label
rules its episode; the judge's sub-tasks count everywhere else. The judge
also reads, blind, every channel day with a labelled episode and a sample of
the days whose episodes a check rewarded (``_to_judge``), and the night reports
its agreement with the labels and checks (``NightResult.agreement``, also in
the manifest).

Every finished work item (a judged or skipped window, a prediction, an
understanding score) is written to the store's night ledger as soon as it is
done, so a night that crashed midway resumes without judging anything twice.

The value memory is not touched here: ``remember`` adds the night's sub-tasks
in one batch, and the night calls it only once training has succeeded. So no
sub-task of this night influences another's prediction, and a re-run of the
night (after a failed training) never retrieves its own answers; ``predict``
also leaves out any memory of this night, in case one is already there.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from core.config import Config
from core.storage.events import Event
from core.storage.store import Store
from trainer.advantages import centre, episode_row, message_advantages, value_row
from trainer.client import JsonClient
from trainer.collect import ANY_RELEASE, Collection, collect, write_manifest
from trainer.context import prefix_refs, with_context
from trainer.judge import Judge, SubTask, WindowResult, channel_days
from trainer.labellers import cap_labels
from trainer.rewards import (
    agreement,
    episode_subtask,
    group_relative,
    overridden,
    person_reward,
    reward_stats,
    task_advantages,
)
from trainer.secrets import SecretScanner
from trainer.understanding import sampled, understanding_score
from trainer.value import Prediction, ValueMemory, predict, prediction_reward

Progress = Callable[[str, dict], None]


@dataclass
class NightResult:
    night_id: int
    dataset: Path
    manifest: dict
    counts: Counter = field(default_factory=Counter)
    timings: dict[str, float] = field(default_factory=dict)
    subtasks: list[SubTask] = field(default_factory=list)  # what ``remember`` stores
    agreement: dict = field(default_factory=dict)  # the judge against labels and checks
    rewards: dict = field(default_factory=dict)  # source -> {n, mean, spread} (reward_stats)
    labellers: dict = field(default_factory=dict)  # giver -> labels counted, set aside


def night_dir(config: Config, night_id: int) -> Path:
    return config.data_dir / "nights" / f"night-{night_id:04d}"


async def run_part1(config: Config, store: Store, night_id: int, client: JsonClient,
                    memory: ValueMemory, since: float | None, until: float,
                    progress: Progress = lambda s, d: None,
                    release: object = ANY_RELEASE) -> NightResult:
    settings, counts, timings = config.night, Counter(), {}
    clock = time.perf_counter()
    scanner = SecretScanner(config.secret_values())
    collection = await collect(store, scanner, settings.eval_percent, since, until, release)
    labellers = cap_labels(collection.episodes, settings.labels_per_person,
                           config.discord.admin_user_ids)
    days = channel_days(collection.episodes)
    counts.update({f"excluded:{k}": v for k, v in collection.excluded.items()})
    counts["episodes"] = counts["eligible"] = len(collection.episodes)
    counts["episodes_total"] = len(collection.episodes) + sum(collection.excluded.values())
    timings["collect"] = time.perf_counter() - clock
    progress("collected", dict(counts))

    clock = time.perf_counter()
    read = _to_judge(collection, days, settings)
    counts["channels_checked_unjudged"] = len(days) - len(read)
    judged = await _judge_all(store, night_id, Judge(client, settings), read, counts, progress)
    ruling, subtasks, agreed = _by_precedence(collection, days, judged, settings, counts)
    timings["judge"] = time.perf_counter() - clock
    progress("rewards", {"agreement": agreed})

    clock = time.perf_counter()
    predictions = await _predict_all(store, night_id, client, memory, subtasks, settings, counts,
                                     progress)
    timings["value"] = time.perf_counter() - clock

    clock = time.perf_counter()
    unruled = [e for e in collection.episodes if e.id not in ruling]  # a check or label outranks it
    understood = await _understand_all(store, night_id, client, unruled, settings, counts,
                                       progress)
    timings["understand"] = time.perf_counter() - clock

    clock = time.perf_counter()
    rows, table = await _rows(store, days, collection, subtasks, ruling, predictions, understood,
                              settings, counts, scanner)
    await store.save_advantages(night_id, table)
    out = night_dir(config, night_id)
    dataset = _write_jsonl(out / "train.jsonl", rows)
    sources = {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("source:")}
    manifest = write_manifest(out / "manifest.json", collection, rows,
                              {"judge_agreement": agreed, "reward_sources": sources})
    counts["rows"], counts["advantages"] = len(rows), len(table)
    timings["advantages"] = time.perf_counter() - clock
    progress("advantages", dict(counts))
    return NightResult(night_id, dataset, manifest, counts, timings, subtasks, agreed,
                       reward_stats(subtasks), labellers)


def _to_judge(collection: Collection, days: dict, settings) -> dict:
    """The channel days the judge reads: every one with an episode no check rewarded,
    and a sample of the rest, for its agreement figure: ``judge_checked_fraction`` of
    them, at most ``judge_checked_max`` (an agreement's precision is set by how many it
    reads, not by the share; a day of 1,000 practice attempts would else cost an hour)."""
    labelled = {e.id for e in collection.episodes if person_reward(e.labels) is not None}
    checked = {e for e, v in collection.verified.items()
               if v.reward is not None and e not in labelled}
    out, sample = {}, []
    for channel, day in days.items():
        if not {m.episode_id for m in day} <= checked:
            out[channel] = day
        elif sampled(_channel_key(channel), settings.judge_checked_fraction, settings.seed):
            sample.append(channel)
    for channel in sorted(sample, key=_channel_key)[:settings.judge_checked_max]:
        out[channel] = days[channel]
    return out


def _channel_key(channel: str) -> int:
    return int.from_bytes(hashlib.sha256(channel.encode()).digest()[:4], "big")


def remember(memory: ValueMemory, result: NightResult, now: float,
             forgotten: set[int] = frozenset()) -> None:
    """The night's one memory update: call it only after training succeeded. Sub-tasks
    written from an episode forgotten since (``forgotten``) are not remembered."""
    kept = [s for s in result.subtasks if not set(s.episodes) & forgotten]
    memory.add_batch(kept, result.night_id, now)


def _by_precedence(collection: Collection, days: dict, judged: list[SubTask], settings,
                   counts: Counter) -> tuple[dict[int, SubTask], list[SubTask], dict]:
    """(episode -> the sub-task that rules it, the night's sub-tasks, judge agreement)."""
    ruling = {}
    for episode in collection.episodes:
        found = episode_subtask(episode, days[episode.channel_id],
                                collection.verified.get(episode.id), settings)
        if found is not None:
            ruling[episode.id] = found
    people = {e.id: r for e in collection.episodes if (r := person_reward(e.labels)) is not None}
    agreed = agreement(judged, ruling, days, people)
    ruled = set(ruling)
    kept = [s for s in judged if not overridden(s, days[s.channel], ruled)]
    subtasks = [*ruling.values(), *kept]
    for s in subtasks:
        if not s.episodes:  # a check's or a label's, or judged before records named them
            s.episodes = sorted({m.episode_id for m in days[s.channel][s.start:s.end + 1]})
        counts[f"source:{s.source}"] += 1
        if s.looped:
            counts["looped"] += 1  # a check's reward held down: the attempt looped
    counts["subtasks_overridden"] = len(judged) - len(kept)
    return ruling, subtasks, agreed


async def _judge_all(store: Store, night_id: int, judge: Judge, days: dict, counts: Counter,
                     progress: Progress) -> list[SubTask]:
    done = await store.records(night_id, "judgment")
    subtasks: list[SubTask] = []
    for channel, day in days.items():
        for lo in range(0, len(day), judge.settings.window_messages):
            key = f"{channel}:{lo}"
            if key not in done:
                result = await judge.judge_window(channel, day, lo)
                done[key] = _window_record(result)
                await store.put_record(night_id, "judgment", key, done[key])
                progress("judging", {"window": key, "status": result.status})
            else:
                counts["windows_resumed"] += 1
            record = done[key]
            counts[f"windows_{record['status']}"] += 1
            subtasks += [SubTask(**s) for s in record["subtasks"]]
    # A range reported twice (in one report, or from two windows' extended views) is one
    # sub-task: the first report of it counts.
    unique = list({s.key: s for s in reversed(subtasks)}.values())[::-1]
    counts["subtasks"] = len(unique)
    counts["subtasks_duplicate"] = len(subtasks) - len(unique)
    return unique


def _window_record(result: WindowResult) -> dict:
    # ``episodes``: what /forget deletes it for (core.storage.forgetting).
    return {"status": result.status, "subtasks": [s.as_dict() for s in result.subtasks],
            "attempts": result.attempts, "extends": result.extends, "reason": result.reason,
            "episodes": result.episodes}


async def _predict_all(store: Store, night_id: int, client: JsonClient, memory: ValueMemory,
                       subtasks: list[SubTask], settings, counts: Counter,
                       progress: Progress) -> dict[str, Prediction]:
    done = await store.records(night_id, "prediction")
    grouped = Counter(s.group for s in subtasks if s.group)
    for subtask in subtasks:
        if subtask.key in done or grouped[subtask.group] >= 2:
            continue  # a practice group's mean is its baseline (task_advantages): not asked
        found = await predict(client, memory, subtask, settings.value_neighbours,
                              settings.half_life_days, exclude_night=night_id)
        done[subtask.key] = ({"missing": True} if found is None else
                             {"reward": found.reward, "length": found.length, "prompt": found.prompt,
                              "answer": found.answer, "neighbours": found.neighbours,
                              "episodes": found.episodes})
        await store.put_record(night_id, "prediction", subtask.key, done[subtask.key])
        progress("value", {"subtask": subtask.key})
    wanted = {s.key for s in subtasks}  # the ledger may hold keys a label has since overridden
    out = {k: Prediction(k, v["reward"], v["length"], v["prompt"], v["answer"], v["neighbours"],
                         v.get("episodes", []))
           for k, v in done.items() if k in wanted and not v.get("missing")}
    counts["predictions"] = len(out)
    counts["predictions_missing"] = sum(1 for k, v in done.items() if k in wanted and v.get("missing"))
    return out


async def _understand_all(store: Store, night_id: int, client: JsonClient, episodes: list,
                          settings, counts: Counter, progress: Progress) -> dict[int, float]:
    done = await store.records(night_id, "understanding")
    for episode in episodes:
        key = str(episode.id)
        if key in done or not sampled(episode.id, settings.understanding_fraction, settings.seed):
            continue
        score = await understanding_score(client, episode)
        done[key] = {"score": score, "episodes": [episode.id]}
        await store.put_record(night_id, "understanding", key, done[key])
        progress("understanding", {"episode": episode.id})
    asked = {str(e.id) for e in episodes}  # a resumed ledger may hold episodes since ruled
    out = {int(k): v["score"] for k, v in done.items() if k in asked and v["score"] is not None}
    counts["understood"] = len(out)
    return out


async def _rows(store: Store, days: dict, collection: Collection, subtasks: list[SubTask],
                ruling: dict[int, SubTask], predictions: dict[str, Prediction],
                understood: dict[int, float], settings, counts: Counter,
                scanner: SecretScanner) -> tuple[list[dict], list[dict]]:
    task_adv = task_advantages(subtasks, predictions, settings)
    grouped = group_relative(subtasks)
    ruled = {episode: s.key for episode, s in ruling.items()}
    covered: dict[int, list[float]] = {}
    for channel, day in days.items():
        mine = [s for s in subtasks if s.channel == channel]
        covered.update(message_advantages(day, mine, task_adv, ruled))
    strays = {e["payload"]["step_id"] for e in await store.events(Event.STRAY_END_OF_TURN)
              if e["payload"].get("answer") == "no"}
    rows, table = [], []
    prefixes = await store.prompt_prefixes(prefix_refs(collection.episodes))
    for episode in collection.episodes:
        understanding = None if episode.id in ruling else understood.get(episode.id)
        row, adv = episode_row(episode, collection.split[episode.id], covered, understanding,
                               strays, settings)
        rule = ruling.get(episode.id)
        row["group_baseline"] = bool(rule and rule.group in grouped)  # centre() leaves it
        row["group"] = rule.group if row["group_baseline"] else ""  # trainer.margins
        row["reward_source"] = ({"source": rule.source, "check": rule.check, "reward": rule.reward,
                                 "looped": rule.looped}
                                if rule else {"source": "judge"})
        if settings.imitate_passing and row["group_baseline"] and passed(rule, grouped):
            imitate_own(row)
            counts["imitated_passing"] += 1
        exact, fallback = with_context(row, episode, prefixes, scanner.has_secret)
        counts[f"context:{fallback or 'exact'}"] += 1  # the exact prompt, or why not
        rows += exact
        table += adv
    counts["advantage_mean_before_centring"] = round(centre(rows, table), 6)
    by_key = {s.key: s for s in subtasks}
    value_rewards = {k: prediction_reward(by_key[k], p) for k, p in predictions.items()
                     if k in by_key}
    if value_rewards:
        baseline = sum(value_rewards.values()) / len(value_rewards)
        rows += [value_row(predictions[k].prompt, predictions[k].answer, r, baseline,
                           sorted(set(by_key[k].episodes) | set(predictions[k].episodes)))
                 for k, r in value_rewards.items()]
    return rows, table


def passed(rule: SubTask, grouped: dict[str, list[SubTask]]) -> bool:
    """Whether this attempt scored its group's best and the group's attempts differ."""
    rewards = [p.reward for p in grouped[rule.group]]
    return rule.reward == max(rewards) > min(rewards)


def imitate_own(row: dict) -> None:
    """Add the row's judged agent messages to what it imitates (they keep their OAPL
    advantages): the model wrote them and they passed, so raise their likelihood."""
    judged = {i for i, a in enumerate(row["advantages"]) if a is not None}
    row["imitate"] = sorted(set(row.get("imitate") or ()) | judged)


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(partial, path)
    return path
