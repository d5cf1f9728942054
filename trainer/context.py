"""The exact context: an episode's training rows as the prompts the model was sent.

Each assistant step the agent stored names its prompt (``core.storage.prefixes``):
a prefix (the system prompt with its tool set, the channel history the turn
was given, a compaction summary), then the episode's ``tail`` steps just before
it. ``trainer.advantages.episode_row`` builds the episode-only row (one message
per step); ``with_context`` turns it into rows whose messages are exactly
those prompts:

- consecutive actions sent the same prefix and the same first episode step
  form one group, and one row: ``prefix + episode[start:end]``, where ``end``
  is the next group's first action (or the episode's end). A turn without a
  compaction is one group; each compaction starts another;
- a row's first ``context`` messages are context only, neither actions nor
  observations (``trainer.tokens``): the prefix (earlier turns were trained,
  or not, as their own episodes) and, after a compaction, the episode's steps
  an earlier group's row already rendered; so each action is trained once and
  each observation counted once;
- ``prefix_messages`` says where the episode's own messages begin.

Fallback, with the reason counted by the night: an episode stored before
prefixes existed, one whose prefix was deleted (``/forget`` of an episode whose
text it carried), one whose step references do not fit its steps, and one
whose prefix holds a secret trains on its own messages alone, as before. Images
a vision model was shown are rendered as the text placeholder the store keeps.
"""

from __future__ import annotations

from typing import Callable

from core.storage.store import Episode


def prefix_refs(episodes: list[Episode]) -> set[str]:
    """The prompt prefixes the episodes' assistant steps refer to."""
    return {ctx["prefix"] for e in episodes for s in e.steps
            if isinstance(ctx := (s.meta or {}).get("context"), dict) and "prefix" in ctx}


def _groups(row: dict, episode: Episode, prefixes: dict[str, dict]
            ) -> tuple[list[tuple[str, int, list[int]]], str | None]:
    """[(prefix ref, first episode message, actions)] in order, or the fallback reason."""
    steps, harness = episode.steps, set(row.get("harness") or ())
    groups: list[tuple[str, int, list[int]]] = []
    for i, step in enumerate(steps):
        if step.role != "assistant" or i in harness:
            continue
        ctx = (step.meta or {}).get("context")
        if not isinstance(ctx, dict) or "prefix" not in ctx:
            return [], "no-prefix"
        if ctx["prefix"] not in prefixes:
            return [], "prefix-missing"
        start = i - int(ctx.get("tail", -1))
        if not 0 < start <= i or any(s.role == "system" for s in steps[start:i]):
            return [], "prefix-mismatch"
        if groups and groups[-1][:2] == (ctx["prefix"], start):
            groups[-1][2].append(i)
        else:
            groups.append((ctx["prefix"], start, [i]))
    return groups, None


def with_context(row: dict, episode: Episode, prefixes: dict[str, dict],
                 has_secret: Callable[[str], bool] = lambda text: False
                 ) -> tuple[list[dict], str | None]:
    """(the rows, None) rendered from the stored prompts, or ([row], why not)."""
    groups, why = _groups(row, episode, prefixes)
    if why is None and not groups:
        return [row], None  # nothing to train; collect excludes such episodes anyway
    if why is None and any(has_secret(_text(prefixes[ref]["messages"])) for ref, _, _ in groups):
        why = "prefix-secret"
    if why is not None:
        return [row], why
    rows, covered = [], None
    messages, advantages = row["messages"], row.get("advantages") or []
    for g, (ref, start, actions) in enumerate(groups):
        end = groups[g + 1][2][0] if g + 1 < len(groups) else len(messages)
        prefix = prefixes[ref]["messages"]
        at = {old: len(prefix) + k for k, old in enumerate(range(start, end))}  # row index -> new
        seen = max(0, covered - start) if covered is not None else 0
        rows.append({
            **row,
            "messages": [*prefix, *messages[start:end]],
            "tools": prefixes[ref]["tools"],
            "advantages": [None] * len(prefix) + [advantages[o] if o in actions
                                                  and o < len(advantages) else None
                                                  for o in range(start, end)],
            "harness": [at[h] for h in row.get("harness") or () if h in at],
            "imitate": [at[i] for i in row.get("imitate") or () if i in actions],
            "token_overrides": [{**o, "message": at[o["message"]]}
                                for o in row.get("token_overrides") or ()
                                if o["message"] in actions],
            # The episodes whose text the row holds: /forget of one drops it (a night
            # already running rechecks before it trains: core.storage.copies).
            "sources": sorted({*row.get("sources", ()), *prefixes[ref].get("sources", ())}),
            "context": len(prefix) + seen,
            "prefix_messages": len(prefix),
            "context_group": g,
        })
        covered = end
    return rows, None


def _text(messages: list[dict]) -> str:
    parts = []
    for m in messages:
        content = m.get("content")
        parts.append(content if isinstance(content, str) else str(content or ""))
        if m.get("tool_calls"):
            parts.append(str(m["tool_calls"]))
    return "\n".join(parts)


def sent_messages(row: dict, episode: Episode, prefixes: dict[str, dict], step: int
                  ) -> list[dict] | None:
    """The messages assistant step ``step`` (an index into ``episode.steps``) was sent,
    as the night renders them; None when it has no stored prompt."""
    ctx = (episode.steps[step].meta or {}).get("context") or {}
    prefix = prefixes.get(ctx.get("prefix"))
    if prefix is None:
        return None
    return [*prefix["messages"], *row["messages"][step - int(ctx["tail"]):step]]
