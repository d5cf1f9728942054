"""kill -9 between the trainer's release writes: nothing half-written or gate-failed is
ever what ``/promote`` would serve.

A child process writes releases as a night's end does, in a loop: the release folder
(``trainer.export.seal``: files, their hashes in release.json, one rename), then the
store's row with the gate's decision (``Store.add_release``; half the gates reject). The
probe kills it with SIGKILL at a random moment, many times, and after each kill opens
the real SQLite store afresh and checks what promote reads:

- every row whose stored gate rejected it is ``rejected`` or refused (``gate_rejected``);
- every row promote would take (a candidate its gate did not reject) has its files whole
  (``release_problem`` is None): no row points at a ``*.partial`` folder or a torn file;
- the store opens and answers after every kill.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
from pathlib import Path

from bench.probes import Tally
from core.storage.store import Store
from serving.releases import gate_rejected, release_problem

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import asyncio, os, shutil, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from core.storage.store import Store
from serving.releases import gate_rejected
from trainer.export import seal

async def main(data: Path, first: int) -> None:
    store = await Store.open(data / "store.db")
    for i in range(first, first + 1000):
        name = f"night-{{i:05d}}"
        release_dir = data / "releases" / name
        partial = release_dir.with_name(name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        (partial / "model-q8_0.gguf").write_bytes(os.urandom(3 << 20))
        (partial / "adapter_model.safetensors").write_bytes(os.urandom(1 << 20))
        seal(partial, release_dir, {{"format": 1, "mode": "merged", "night": i,
                                     "serve": {{"gguf": "model-q8_0.gguf"}}}})
        reject = i % 2 == 1
        meta = {{"gguf": str(release_dir / "model-q8_0.gguf"), "night": i,
                 "gate": {{"outcome": "reject" if reject else "promote", "passed": not reject,
                          "reasons": ["planted"]}}}}
        state = "rejected" if gate_rejected({{"meta": meta}}) else "candidate"
        await store.add_release(name, str(release_dir), meta, state)
        print(i, flush=True)

asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
"""


async def _after_kill(data: Path) -> tuple[int, list[str]]:
    """(rows, problems): what promote would meet in the store left by the kill."""
    store = await Store.open(data / "store.db")
    try:
        releases = await store.releases()
    finally:
        await store.close()
    problems = []
    for release in releases:
        if gate_rejected(release):
            continue  # promote refuses it whatever its state (serving.releases.promote)
        if release["state"] == "candidate" and (why := release_problem(release)):
            problems.append(f"#{release['id']} {release['name']} would be served: {why}")
        if release["path"].endswith(".partial"):
            problems.append(f"#{release['id']} points at a partial folder")
    return len(releases), problems


async def run(tally: Tally, work: Path, quick: bool) -> None:
    trials = 8 if quick else 30
    rng = random.Random(40)
    data = work / "data"
    data.mkdir()
    script = CHILD.format(root=str(ROOT))
    written = 0
    for trial in range(trials):
        child = subprocess.Popen([sys.executable, "-c", script, str(data), str(trial * 1000)],
                                 stdout=subprocess.PIPE, text=True)
        await asyncio.sleep(0.4 + rng.random() * 0.8)  # past its start, into the writes
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate()
        written += len(out.split())
        try:
            rows, problems = await _after_kill(data)
        except Exception as exc:  # noqa: BLE001 - a store that no longer opens is a failure
            tally.check(f"kill {trial + 1}: the store opens after the kill", False, repr(exc))
            continue
        tally.check(f"kill {trial + 1}: nothing torn or gate-failed is servable ({rows} rows)",
                    not problems, json.dumps(problems)[:300])
    partial = len(list((data / "releases").glob("*.partial")))
    tally.notes.append(f"{trials} kills over {written} releases written; {partial} partial "
                       "folders left, none of them a release")
