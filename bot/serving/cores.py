"""How many threads llama.cpp should generate with: one per physical core.

llama-cpp-python's server and ``Llama`` default to ``cpu_count() // 2`` generation threads,
which assumes every core has a hyper-threaded sibling. On a machine whose CPUs are each a
core of their own (most cloud VMs, and the 2-core machines here) that halves generation:
one thread decoded 27 tokens/s of the embedded model where two decoded 48. A decode is
bound by memory and arithmetic per core, so a sibling adds little and one thread per
physical core is the right count in both cases. The topology comes from sysfs, restricted
to the CPUs this process may run on; without sysfs, every usable CPU counts.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSFS = Path("/sys/devices/system/cpu")


def usable_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


def physical_cores(cpus: set[int] | None = None, sysfs: Path = SYSFS) -> int:
    """Distinct (package, core) pairs among ``cpus`` (the usable ones by default), at least 1."""
    cpus = usable_cpus() if cpus is None else cpus
    cores = set()
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            cores.add((topology.joinpath("physical_package_id").read_text().strip(),
                       topology.joinpath("core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))  # no topology: the CPU counts as its own core
    return max(len(cores), 1)


def generation_threads(configured: int) -> int:
    """``server.threads`` when set (> 0), else one per physical core."""
    return configured if configured > 0 else physical_cores()
