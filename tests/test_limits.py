"""Issue 11, part 2: limits for all channels together (jobs, disk, memory), through the
real sandbox; and a full workspace never stops the store or other channels.

Each test here failed on the code before the fix it names.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.paths import Workspace
from sandbox.process import Sandbox
from tools import ToolContext, default_registry
from tools.jobs import JobSlots

REGISTRY = default_registry()
SLEEP = "import time\ntime.sleep(30)"


def need_bwrap() -> None:
    if not Sandbox().sandboxed:
        pytest.fail("bubblewrap 0.8+ is missing. Fix: apt-get install bubblewrap.",
                    pytrace=False)


@pytest.fixture
async def contexts(tmp_path: Path):
    """Contexts of channels that share one sandbox and one JobSlots (as in the runtime)."""
    need_bwrap()
    made: list[ToolContext] = []

    def make(channel: str, **services) -> ToolContext:
        ctx = ToolContext.open(channel, Workspace(tmp_path / f"ws-{channel}"),
                               tmp_path / f"state-{channel}", **services)
        made.append(ctx)
        return ctx

    yield make
    for ctx in made:
        runner = ctx.services.get("jobs_runner")
        if runner is not None:
            await runner.close()


async def test_jobs_are_capped_per_channel_and_in_total(contexts):
    slots = JobSlots(per_channel=1, total=2)
    a, b, c = (contexts(name, job_slots=slots) for name in "abc")
    assert (await REGISTRY.call("job_start", {"code": SLEEP}, a)).ok
    second = await REGISTRY.call("job_start", {"code": SLEEP}, a)
    assert not second.ok and "most allowed at once (1)" in second.output
    assert (await REGISTRY.call("job_start", {"code": SLEEP}, b)).ok
    third = await REGISTRY.call("job_start", {"code": SLEEP}, c)
    assert not third.ok and "over all channels" in third.output
    stopped = await REGISTRY.call("job_stop", {"job_id": "j1"}, a)
    assert stopped.ok, stopped.output  # frees a slot
    assert (await REGISTRY.call("job_start", {"code": SLEEP}, c)).ok
