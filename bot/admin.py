"""Admin actions: plain async functions that return the text to show.

Each takes the services it acts on (the store, the supervisor, the channel workers and
spaces, the night's watch, the releases), not the whole runtime. They are listed, with
their arguments and help, in ``bot.commands``, the one table from which Discord's slash
commands, the console and ``/help`` are made, and which hands each one its services;
the permission check and the error policy live there too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bot.night.jobs import ACTIVE, STAGES, stop_trainer
from tools.system import reset_sys_section

if TYPE_CHECKING:
    from bot.agent.loop import Agent
    from bot.channels import ChannelSpaces, ChannelWorkers
    from bot.night.watch import NightWatch
    from core.storage.store import Store
    from serving.releases import Releases
    from serving.supervisor import ServerSupervisor


async def status(store: Store, sup: ServerSupervisor, workers: ChannelWorkers,
                 spaces: ChannelSpaces | None = None, channel: str = "") -> str:
    """The model, the server, the queues, the night, and (with ``spaces``) the disk:
    ``channel``'s own use and the data folder's total, never another channel's name."""
    live = [r for r in await store.releases() if r["state"] == "live"]
    model = live[0]["name"] if live else f"base ({sup.gguf.name})"
    queues = {c: n for c, n in workers.queue_sizes().items() if n}
    nights = await store.jobs("sleep")
    night = f"job #{nights[-1]['id']} {nights[-1]['state']}" if nights else "none yet"
    health = "ready" if sup.ready else "NOT READY"
    return (f"model: {model}\n"
            f"server: {health} at {sup.base_url} (pid {sup.pid}, restarts {sup.restarts}, "
            f"last restart: {sup.last_restart_reason or 'none'})\n"
            f"queues: {queues or 'all empty'}\n"
            f"night: {night}" + _disk_line(spaces, channel))


def _disk_line(spaces: ChannelSpaces | None, channel: str) -> str:
    disk = spaces.services.disk if spaces is not None else None
    return "" if disk is None else f"\ndisk: {disk.report(channel)}"


async def sleep(store: Store, night: NightWatch, agent: Agent, requested_by: str,
                channel: str) -> str:
    """Record a night request and launch its trainer. The check for a night already under
    way and the new job are one transaction: two /sleeps at once start one night."""
    # From the end of the last promoted night's collection: an unpromoted night's data stays.
    since = await store.next_night_since()
    data_dir = agent.config.data_dir
    view = await asyncio.to_thread(write_agent_view, agent, data_dir)
    job, running = await store.create_exclusive_job(
        "sleep", {"requested_by": requested_by, "channel": channel, "since": since,
                  "requested_at": time.time(), "agent_view": str(view)}, ACTIVE)
    if running is not None:
        return f"A night is already {running['state']} (job #{job})."
    episodes = await store.episodes_since(since)
    await night.launch(job)
    when = "the start" if not since else time.strftime("%Y-%m-%d %H:%M", time.localtime(since))
    return (f"Going to sleep: night job #{job} over {len(episodes)} episodes since {when}.\n"
            f"It runs {' → '.join(STAGES)}; /wake cancels it. "
            f"Log: {data_dir / 'logs' / f'night-{job}.log'}")


def write_agent_view(agent: Agent, data_dir: Path) -> Path:
    """What the agent sends a fresh channel (its system prompt and tools), for the night's
    gate to render its items the same way (trainer.gate_items). Named by its hash: one
    file per distinct view."""
    view = {"system": agent.system_prompt_for(""), "tools": agent.tools.schemas()}
    text = json.dumps(view, ensure_ascii=False, sort_keys=True)
    folder = data_dir / "agent-views"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not path.is_file():
        # A name of its own per writer: two /sleeps at once write the same view in two
        # threads, and a shared partial file was replaced from under the second one.
        partial = path.with_name(f"{path.name}.{os.urandom(4).hex()}.partial")
        partial.write_text(text)
        os.replace(partial, path)
    return path


async def wake(store: Store) -> str:
    active = await store.jobs("sleep", list(ACTIVE))
    for job in active:
        await store.update_job(job["id"], state="cancelled")
        stop_trainer(job["pid"], job["id"])  # only if that pid is still this night's trainer
    if not active:
        return "No night is queued or running."
    return "Cancelled night job(s) " + ", ".join(f"#{j['id']}" for j in active) + "."


async def promote(releases: Releases, release_id: int | None = None) -> str:
    return await releases.promote(release_id)


async def rollback(releases: Releases, release_id: int | None = None) -> str:
    return await releases.rollback(release_id)


async def label(store: Store, episode_id: int, value: str, source: str) -> str:
    try:
        await store.add_label(episode_id, value, source)
    except ValueError as exc:
        return f"Not labelled: {exc}"
    return f"Episode #{episode_id} labelled {value}."


async def sys_show(spaces: ChannelSpaces, channel: str) -> str:
    section = spaces.sys_section(channel).strip()
    return section or "(this channel's editable system section is empty)"


async def sys_reset(workers: ChannelWorkers, spaces: ChannelSpaces, channel: str,
                    wait_s: float = 10.0) -> str:
    # Under the channel's lock: a turn running meanwhile writes the same journal. A turn can
    # last long (a single-GPU night makes it wait for the morning): then say so, not hang.
    lock = workers.lock(channel)
    try:
        await asyncio.wait_for(lock.acquire(), wait_s)
    except TimeoutError:
        return ("This channel is in the middle of a turn; nothing was reset. "
                "Try again once it has answered.")
    try:
        reset_sys_section(spaces.context(channel))
    finally:
        lock.release()
    return "This channel's editable system section was reset (undo restores it)."


async def restart_server(supervisor: ServerSupervisor) -> str:
    await supervisor.restart("admin request")
    return f"Model server restarted (pid {supervisor.pid})."


async def notes_wipe(spaces: ChannelSpaces, channel: str, confirm: str | None = None) -> str:
    """Delete every note of the channel, with no undo: only with the literal word CONFIRM.
    (The routine cleaning, ``/notes-clean``, is ``bot.hygiene.routine_clean``.)"""
    notes = spaces.context(channel).services.notes
    if notes is None:
        return "Notes are not enabled."
    if confirm != "CONFIRM":
        count = await asyncio.to_thread(notes.count, channel, False)
        return (f"Nothing deleted. /notes-wipe deletes all {count} notes of this channel (and "
                "the shared notes it wrote) with no undo; to do it, type /notes-wipe CONFIRM. "
                "/notes-clean tidies the notes up instead.")
    removed = await asyncio.to_thread(notes.clean, channel)
    return f"Wiped {removed} notes of this channel."
