"""How many threads the kernels run on: the host's cores, not TVM's guess.

TVM's runtime sizes its thread pool, unless ``TVM_NUM_THREADS`` (or ``OMP_NUM_THREADS``) says otherwise, to half
the logical CPUs on x86, assuming two hardware threads per core. On a machine without SMT (most cloud VMs) it
then runs every parallel kernel on half the cores: a 2-core Zen 5 VM ran ResNet-50 in 40 ms with one thread
where two threads take 20 ms, and ONNX Runtime uses both. The schedules split their parallel loops for the
host target's ``num-cores``; the pool should have that many threads.

``physical_cores()`` counts the cores this process may run on (its CPU affinity), SMT siblings once.
``use_physical_cores()`` sets ``TVM_NUM_THREADS`` to it when neither variable is set; TVM reads it when the
pool is first used, so the package does this on import (a pool already running keeps its size).
"""

from __future__ import annotations

import os
from pathlib import Path


SYSFS_CPUS = Path("/sys/devices/system/cpu")


def physical_cores(cpus=None, sysfs: Path = SYSFS_CPUS) -> int:
    """Cores among ``cpus`` (default: the CPUs this process may run on), hardware threads of one core
    counted once (Linux sysfs; elsewhere the logical CPU count)."""
    try:
        cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        siblings = sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


def use_physical_cores() -> None:
    """``TVM_NUM_THREADS`` = the host's cores, unless the user set the thread count."""
    if "TVM_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        os.environ["TVM_NUM_THREADS"] = str(physical_cores())
