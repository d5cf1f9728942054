"""Admin actions, shared by Discord's slash commands and the console.

Each action is a plain async function of the Runtime that returns the text to
show, so the front ends stay thin wrappers (a permission check plus a call)
and the actions are tested directly. Permission is checked in code against the
configured admin users and roles: Discord's ``default_permissions`` alone is
not enough, since any server admin can change it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from bot.config import Config

if TYPE_CHECKING:
    from bot.runtime import Runtime

NIGHT_STAGES = ("collect", "judge", "value", "understand", "advantages", "train (LoRA, OAPL+ECHO)",
                "export (merge, q8_0 GGUF)", "gate (held-out eval)", "release")
ACTIVE_NIGHT = ["queued", "running", "judging", "training", "exporting", "gating"]


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
    await rt.night.launch(job)
    when = "the start" if not since else time.strftime("%Y-%m-%d %H:%M", time.localtime(since))
    return (f"Going to sleep: night job #{job} over {len(episodes)} episodes since {when}.\n"
            f"It runs {' → '.join(NIGHT_STAGES)}; /wake cancels it. "
            f"Log: {rt.config.data_dir / 'logs' / f'night-{job}.log'}")


async def wake(rt: Runtime) -> str:
    from bot.nightwatch import stop_trainer

    active = await rt.store.jobs("sleep", ACTIVE_NIGHT)
    for job in active:
        await rt.store.update_job(job["id"], state="cancelled")
        stop_trainer(job["pid"])
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
    """Serve an earlier release (the newest retired one by default), or the base model
    when no earlier release exists."""
    releases = await rt.store.releases()
    earlier = [r for r in releases if r["state"] == "retired"
               and (release_id is None or r["id"] == release_id)]
    if earlier:
        return await _serve_release(rt, earlier[-1], "rollback")
    if release_id is not None:
        return f"Release #{release_id} is not a retired release."
    live = [r for r in releases if r["state"] == "live"]
    if not live:
        return "The base model is already serving; there is nothing to roll back."
    try:
        await rt.supervisor.swap(rt.config.served_gguf, mode=_swap_mode(rt),
                                 reason="rollback to the base model")
    except Exception as exc:
        return f"Rollback failed ({exc}); still serving release #{live[0]['id']}."
    await rt.store.set_release_state(live[0]["id"], "retired")
    return f"Rolled back to the base model ({rt.config.served_gguf.name})."


def _swap_mode(rt: Runtime) -> str:
    return "restart" if rt.config.night.single_gpu else "blue-green"


def release_problem(release: dict) -> str | None:
    """Why a release may not be served (missing or changed files), or None."""
    path = Path(release["path"])
    manifest = path / "release.json"
    if not manifest.is_file():
        return f"{manifest} is missing"
    files = json.loads(manifest.read_text()).get("files", {})
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            return f"{file} is missing"
        digest = hashlib.sha256()
        with file.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != expected:
            return f"{file} does not match its SHA-256 in release.json"
    return None


async def _serve_release(rt: Runtime, release: dict, why: str) -> str:
    """Swap a release in; a corrupt release or a failed canary never goes live."""
    problem = await asyncio.to_thread(release_problem, release)
    if problem:
        return f"Release #{release['id']} refused: {problem}. Nothing changed."
    meta = release["meta"]
    gguf = Path(meta.get("gguf") or release["path"])
    lora = Path(meta["lora"]) if meta.get("lora") else None
    try:
        await rt.supervisor.swap(gguf, lora=lora, mode=_swap_mode(rt),
                                 reason=f"{why} to release #{release['id']}")
    except Exception as exc:
        return f"Release #{release['id']} failed to start; the old model keeps serving.\n{exc}"
    await rt.store.set_release_state(release["id"], "live")
    for job in await rt.store.jobs("sleep", ["awaiting_promotion"]):
        if job["progress"].get("release_id") == release["id"]:
            await rt.store.update_job(job["id"], state="live")
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
