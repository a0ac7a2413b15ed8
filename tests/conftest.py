"""Tests compile with the built-in rules unless they point ``ASCENDFUSE_SCHEDULES`` at records themselves: the
records shipped in ``schedules/`` are keyed by CPU, so on a host with that CPU they would replace the rules'
schedules of the workloads they were tuned on, and a test about a rule would test a record instead
(``tests/schedule/test_shipped_records.py`` tests the shipped records)."""

import os
import tempfile

from tvm_ascendfuse.schedule.tuned import SCHEDULES_ENV

_NO_RECORDS = tempfile.TemporaryDirectory(prefix="ascendfuse-no-records-")


def pytest_configure(config):
    os.environ.setdefault(SCHEDULES_ENV, _NO_RECORDS.name)
