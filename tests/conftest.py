"""Tests compile with the built-in rules unless they point ``ASCENDFUSE_SCHEDULES`` at records themselves: the
records shipped in ``schedules/`` are keyed by CPU, so on a host with that CPU they would replace the rules'
schedules of the workloads they were tuned on, and a test about a rule would test a record instead
(``tests/schedule/test_shipped_records.py`` tests the shipped records)."""

import os
import tempfile

from tvm_ascendfuse.schedule.tuned import SCHEDULES_ENV

_NO_RECORDS = tempfile.TemporaryDirectory(prefix="ascendfuse-no-records-")


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` runs in one process when the run selects the slow tests: they are the benchmarks, and a
    timing taken while another worker computes on the other core measures the sharing, not the kernel."""
    marks = (config.getoption("markexpr", "") or "").replace(" ", "")
    if "slow" in marks and "notslow" not in marks:
        return 0
    return None


def pytest_configure(config):
    os.environ.setdefault(SCHEDULES_ENV, _NO_RECORDS.name)
