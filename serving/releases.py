"""Releases: what the nights built, and which one serves.

A release is a row in the store (candidate, live or retired) and a folder with
``release.json``, which lists the SHA-256 of every file. Promote and rollback
are the same act: check the folder, swap the model in through the supervisor,
then mark the rows. A corrupt release or a model that fails its canary never
goes live, and the old model keeps serving. A candidate that a newer release
was trained on top of (its ``base_release_id``) is refused, with the newer one
named: serving it would silently drop the newer one's training.

A candidate whose night trained on an episode forgotten since (its meta's
``trained_episodes``; ``trainer.forgets``) is refused and marked rejected, and a
retired one like it is never rolled back to (a rollback goes past it).

What serves is what is live: ``serve_live`` points the supervisor at the live
release before the server first starts, so a restarted bot serves it too.

``Releases`` takes only the services it acts on (config, store, supervisor),
so the admin commands and the night watch share it without knowing the
runtime.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING
from core.storage.events import Event

if TYPE_CHECKING:
    from core.config import Config
    from serving.supervisor import ServerSupervisor
    from core.storage.store import Store

# Each time a release (or the base model: release_id None) goes live, an event records
# what served before it: the chain that rollback walks back.
LIVE_EVENT = Event.RELEASE_LIVE
LIVE_EVENT_CHANNEL = "releases"

logger = logging.getLogger("nightshift.releases")


def release_problem(release: dict) -> str | None:
    """Why a release may not be served (missing or changed files), or None. The model file
    it serves must be among the hashed files (an empty list anchored nothing), and an
    adapter's base GGUF, which lives outside the release, must hash as it did at export."""
    path = Path(release["path"])
    manifest = path / "release.json"
    if not manifest.is_file():
        return f"{manifest} is missing"
    meta = json.loads(manifest.read_text())
    files, serve = meta.get("files", {}), meta.get("serve", {})
    own = serve.get("lora") if meta.get("mode") == "adapter" else serve.get("gguf")
    if not own or own not in files:
        return f"{manifest} does not hash the model file it serves ({own or 'none named'})"
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            return f"{file} is missing"
        if sha256_file(file) != expected:
            return f"{file} does not match its SHA-256 in release.json"
    if meta.get("mode") == "adapter" and not adapter_base_matches(meta):
        return (f"the base GGUF {serve.get('gguf')} is missing or not the one the adapter was "
                "exported for")
    return None


def adapter_base_matches(meta: dict) -> bool:
    """Whether an adapter release's base GGUF (outside the release) hashes as at export."""
    base = Path(meta.get("serve", {}).get("gguf") or "")
    expected = meta.get("base_gguf_sha256")
    return bool(expected) and base.is_file() and sha256_file(base) == expected


def sha256_file(file: Path) -> str:
    """A file's SHA-256, read in 1 MiB blocks (releases, their bases, the converter's sdist)."""
    digest = hashlib.sha256()
    with file.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def built_on(releases: list[dict], release_id: int) -> list[dict]:
    """The releases trained on top of ``release_id``, directly or through others (each
    release's meta names its base as ``base_release_id``); rejected ones do not count."""
    found, frontier = [], {release_id}
    for release in sorted(releases, key=lambda r: r["id"]):
        if release["meta"].get("base_release_id") in frontier:
            frontier.add(release["id"])
            if release["state"] != "rejected":
                found.append(release)
    return found


def gate_rejected(release: dict) -> bool:
    """Whether the gate report stored with a release rejected it."""
    gate = (release.get("meta") or {}).get("gate") or {}
    return gate.get("outcome", "promote" if gate.get("passed", True) else "reject") == "reject"


class Releases:
    """Promote and roll back releases; each answer is the text to show the admin."""

    def __init__(self, config: Config, store: Store, supervisor: ServerSupervisor) -> None:
        self.config = config
        self.store = store
        self.supervisor = supervisor

    @property
    def swap_mode(self) -> str:
        # One GPU cannot hold two models: the swap then restarts the server in place.
        return "restart" if self.config.night.single_gpu else "blue-green"

    async def promote(self, release_id: int | None = None) -> str:
        releases = await self.store.releases()
        candidates = [r for r in releases if r["state"] == "candidate"
                      and (release_id is None or r["id"] == release_id)]
        # A candidate whose stored gate rejected it (a row from before the decision was
        # stored with it, or a crash between the two) is never promoted.
        refused = [r for r in candidates if gate_rejected(r)]
        candidates = [r for r in candidates if not gate_rejected(r)]
        if not candidates:
            if refused:
                return (f"Release #{refused[-1]['id']} failed its gate "
                        f"({'; '.join(refused[-1]['meta']['gate'].get('reasons', []))}); "
                        "it is not served. Nothing changed.")
            return ("No candidate release to promote." if release_id is None
                    else f"Release #{release_id} is not a candidate.")
        gone = await self.store.forgotten_among(candidates[-1]["meta"].get("trained_episodes")
                                                or [])
        if gone:  # its weights hold what they learnt from them (trainer.forgets)
            await self.store.set_release_state(candidates[-1]["id"], "rejected")
            return (f"Release #{candidates[-1]['id']} refused: its night trained on episode(s) "
                    f"{', '.join(f'#{i}' for i in sorted(gone))}, forgotten since, and the "
                    "weights cannot unlearn them; it is marked rejected and never served. "
                    "Nothing changed.")
        newer = built_on(releases, candidates[-1]["id"])
        if newer:
            names = ", ".join(f"#{r['id']}" for r in newer)
            return (f"Release #{candidates[-1]['id']} refused: release(s) {names} were trained "
                    f"on top of it and include its training, so serving #{candidates[-1]['id']} "
                    f"now would drop theirs. Promote {names.split(', ')[-1]} instead. "
                    "Nothing changed.")
        live = [r["id"] for r in releases if r["state"] == "live"]
        return await self._serve(candidates[-1], "promote", live[0] if live else None)

    async def rollback(self, release_id: int | None = None) -> str:
        """Serve the release that served before the live one (or the one named), or the
        base model when none did.

        The chain is the order releases went live (``release_live`` events), not their
        ids: a second rollback goes further back, never forward to the one just left."""
        releases = {r["id"]: r for r in await self.store.releases()}
        live = [r for r in releases.values() if r["state"] == "live"]
        if release_id is not None:
            target = releases.get(release_id)
            if target is None or target["state"] != "retired":
                return f"Release #{release_id} is not a retired release."
            if gone := await self._forgotten_in(target):
                return (f"Release #{release_id} refused: its night trained on episode(s) "
                        f"{gone}, forgotten since. Nothing changed.")
            return await self._serve(target, "rollback", await self._previous(target["id"]))
        if not live:
            return "The base model is already serving; there is nothing to roll back."
        target_id = await self._previous(live[0]["id"])
        seen, skipped = {live[0]["id"]}, []
        # A link to a release that is no longer retired (or a loop) is skipped, and so is one
        # trained on an episode forgotten since: rolling back must not serve it again.
        while target_id is not None and (
                target_id in seen or releases.get(target_id, {}).get("state") != "retired"
                or await self._forgotten_in(releases[target_id])):
            if target_id not in seen and releases.get(target_id, {}).get("state") == "retired":
                skipped.append(f"#{target_id}")
            seen.add(target_id)
            target_id = await self._previous(target_id)
        note = (f" (skipped release(s) {', '.join(skipped)}: trained on an episode forgotten "
                "since)") if skipped else ""
        if target_id is not None:
            target = releases[target_id]
            return await self._serve(target, "rollback", await self._previous(target_id)) + note
        try:
            await self.supervisor.swap(self.config.served_gguf, mode=self.swap_mode,
                                       reason="rollback to the base model")
        except Exception as exc:
            return f"Rollback failed ({exc}); still serving release #{live[0]['id']}."
        await self.store.set_release_state(live[0]["id"], "retired")
        await self._record_live(None, None, "rollback")
        return f"Rolled back to the base model ({self.config.served_gguf.name}){note}."

    async def _forgotten_in(self, release: dict) -> str:
        """The episodes a release's night trained on that were forgotten since, as text
        ("" for none)."""
        gone = await self.store.forgotten_among(release["meta"].get("trained_episodes") or [])
        return ", ".join(f"#{i}" for i in sorted(gone))

    async def _previous(self, release_id: int) -> int | None:
        """What served before ``release_id`` went live (None: the base model)."""
        for event in reversed(await self.store.events(LIVE_EVENT)):
            if event["payload"].get("release_id") == release_id:
                return event["payload"].get("previous")
        # A release made live before the chain was recorded: the newest older retired one.
        older = [r["id"] for r in await self.store.releases()
                 if r["state"] == "retired" and r["id"] < release_id]
        return older[-1] if older else None

    async def _record_live(self, release_id: int | None, previous: int | None,
                           how: str) -> None:
        await self.store.add_event(LIVE_EVENT_CHANNEL, None, LIVE_EVENT,
                                   {"release_id": release_id, "previous": previous, "how": how})

    async def _serve(self, release: dict, why: str, previous: int | None) -> str:
        """Swap a release in; a corrupt release or a failed canary never goes live.

        ``previous`` is what a later rollback from this release goes back to."""
        problem = await asyncio.to_thread(release_problem, release)
        if problem:
            return f"Release #{release['id']} refused: {problem}. Nothing changed."
        meta = release["meta"]
        gguf = Path(meta.get("gguf") or release["path"])
        lora = Path(meta["lora"]) if meta.get("lora") else None
        try:
            await self.supervisor.swap(gguf, lora=lora, mode=self.swap_mode,
                                       reason=f"{why} to release #{release['id']}")
        except Exception as exc:
            return f"Release #{release['id']} failed to start; the old model keeps serving.\n{exc}"
        await self.store.set_release_state(release["id"], "live")
        await self._record_live(release["id"], previous, why)
        for job in await self.store.jobs("sleep", ["awaiting_promotion"]):
            if job["progress"].get("release_id") == release["id"]:
                await self.store.update_job(job["id"], state="live")
        return f"Now serving release #{release['id']} ({release['name']})."


async def serve_live(store: Store, supervisor: ServerSupervisor) -> str | None:
    """Point a not yet started supervisor at the live release; what it serves, or None
    for the base model. A live release whose files fail their check is retired (with a
    warning) and the base model serves: a corrupt release never serves."""
    live = [r for r in await store.releases() if r["state"] == "live"]
    if not live:
        return None
    release = live[0]
    problem = await asyncio.to_thread(release_problem, release)
    if problem:
        logger.warning("live release #%s cannot serve (%s); retired, serving the base model",
                       release["id"], problem)
        await store.set_release_state(release["id"], "retired")
        return None
    meta = release["meta"]
    supervisor.gguf = Path(meta.get("gguf") or release["path"])
    supervisor.lora = Path(meta["lora"]) if meta.get("lora") else None
    return f"release #{release['id']} ({release['name']})"
