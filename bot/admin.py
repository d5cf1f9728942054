"""Admin actions, shared by Discord's slash commands and the console.

Each action is a plain async function of the Runtime that returns the text to
show, so the front ends stay thin wrappers (a permission check plus a call)
and the actions are tested directly. Permission is checked in code against the
configured admin users and roles: Discord's ``default_permissions`` alone is
not enough, since any server admin can change it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from bot.config import Config

if TYPE_CHECKING:
    from bot.runtime import Runtime

NIGHT_STAGES = ("collect", "judge", "value", "understand", "advantages", "train (LoRA, OAPL+ECHO)",
                "export (merge, q8_0 GGUF)", "gate (held-out eval)", "release")
ACTIVE_NIGHT = ["queued", "running"]


def is_admin(config: Config, user_id: int, role_ids: Iterable[int] = ()) -> bool:
    if user_id in config.discord.admin_user_ids:
        return True
    return bool(set(role_ids) & set(config.discord.admin_role_ids))


async def status(rt: Runtime) -> str:
    sup = rt.supervisor
    live = [r for r in await rt.store.releases() if r["state"] == "live"]
    model = live[0]["name"] if live else f"base ({sup.gguf.name})"
    queues = {c: n for c, n in rt.workers.queue_sizes().items() if n}
    nights = await rt.store.jobs("sleep")
    night = f"job #{nights[-1]['id']} {nights[-1]['state']}" if nights else "none yet"
    health = "ready" if sup.ready else "NOT READY"
    return (f"model: {model}\n"
            f"server: {health} at {sup.base_url} (pid {sup.pid}, restarts {sup.restarts}, "
            f"last restart: {sup.last_restart_reason or 'none'})\n"
            f"queues: {queues or 'all empty'}\n"
            f"night: {night}")


async def sleep(rt: Runtime, requested_by: str, channel: str) -> str:
    """Record a night request. The night pipeline itself is a separate job runner."""
    active = await rt.store.jobs("sleep", ACTIVE_NIGHT)
    if active:
        return f"A night is already {active[-1]['state']} (job #{active[-1]['id']})."
    done = await rt.store.jobs("sleep", ["done"])
    since = done[-1]["updated_at"] if done else 0.0
    episodes = await rt.store.episodes_since(since)
    job = await rt.store.create_job("sleep", {"requested_by": requested_by, "channel": channel,
                                              "since": since, "requested_at": time.time()})
    return (f"Night requested (job #{job}, queued) over {len(episodes)} episodes since "
            f"{'the start' if not since else time.strftime('%Y-%m-%d %H:%M', time.localtime(since))}.\n"
            f"It will run: {' → '.join(NIGHT_STAGES)}.\n"
            "The night runner is not part of this version yet: the request is recorded "
            "and nothing is trained.")


async def wake(rt: Runtime) -> str:
    active = await rt.store.jobs("sleep", ACTIVE_NIGHT)
    for job in active:
        await rt.store.update_job(job["id"], state="cancelled")
    if not active:
        return "No night is queued or running."
    return "Cancelled night job(s) " + ", ".join(f"#{j['id']}" for j in active) + "."


async def promote(rt: Runtime, release_id: int | None = None) -> str:
    releases = await rt.store.releases()
    candidates = [r for r in releases if r["state"] == "candidate"
                  and (release_id is None or r["id"] == release_id)]
    if not candidates:
        return ("No candidate release to promote." if release_id is None
                else f"Release #{release_id} is not a candidate.")
    return await _serve_release(rt, candidates[-1], "promote")


async def rollback(rt: Runtime, release_id: int | None = None) -> str:
    releases = await rt.store.releases()
    earlier = [r for r in releases if r["state"] == "retired"
               and (release_id is None or r["id"] == release_id)]
    if not earlier:
        return ("No earlier release to roll back to." if release_id is None
                else f"Release #{release_id} is not a retired release.")
    return await _serve_release(rt, earlier[-1], "rollback")


async def _serve_release(rt: Runtime, release: dict, why: str) -> str:
    """Serve a release's GGUF; a model that fails to start never goes live."""
    gguf = Path(release["meta"].get("gguf", release["path"]))
    if not gguf.is_file():
        return f"Release #{release['id']} has no GGUF at {gguf}; nothing changed."
    sup = rt.supervisor
    previous = sup.gguf
    sup.gguf = gguf
    try:
        await sup.restart(f"{why} to release #{release['id']}")
    except Exception as exc:
        sup.gguf = previous
        await sup.restart(f"{why} failed; back to {previous.name}")
        return f"Release #{release['id']} failed to start ({exc}); still serving {previous.name}."
    await rt.store.set_release_state(release["id"], "live")
    return f"Now serving release #{release['id']} ({release['name']})."


async def label(rt: Runtime, episode_id: int, value: str, source: str) -> str:
    try:
        await rt.store.add_label(episode_id, value, source)
    except ValueError as exc:
        return f"Not labelled: {exc}"
    return f"Episode #{episode_id} labelled {value}."


async def sys_show(rt: Runtime, channel: str) -> str:
    section = rt.spaces.sys_section(channel).strip()
    return section or "(this channel's editable system section is empty)"


async def sys_reset(rt: Runtime, channel: str) -> str:
    from tools.system import reset_sys_section

    reset_sys_section(rt.spaces.context(channel))
    return "This channel's editable system section was reset (undo restores it)."


async def restart_server(rt: Runtime) -> str:
    await rt.supervisor.restart("admin request")
    return f"Model server restarted (pid {rt.supervisor.pid})."


async def notes_clean(rt: Runtime, channel: str) -> str:
    notes = rt.spaces.context(channel).services.get("notes")
    if notes is None:
        return "Notes are not enabled."
    removed = await asyncio.to_thread(notes.clean, channel)
    return f"Removed {removed} notes of this channel."
