"""Tuned records: a MetaSchedule database for the target wins over the built-in rules where it matches.

The database lives in ``schedules/<target name>/`` (``database_workload.json`` and
``database_tuning_record.json``) of a source checkout, or under the folder named by the environment variable
``ASCENDFUSE_SCHEDULES``. A workload is a kernel as the schedule phase sees it (after FuseTIR and the fast-math
rewrite), so records tuned on these kernels match them structurally; kernels without a record keep the rules.
"""

from __future__ import annotations

import os
from pathlib import Path

import tvm

from .base import ScheduleRule

SCHEDULES_ENV = "ASCENDFUSE_SCHEDULES"
WORKLOADS_FILE = "database_workload.json"
RECORDS_FILE = "database_tuning_record.json"


# Attributes a workload keeps; the others (names, our scheduled flag) would make every lookup miss. TVM's
# layout-free marking stays: it decides whether a rule packs a constant weight at compile time, so a record
# tuned with packing must not be used for a kernel whose weight arrives at run time, and vice versa.
_WORKLOAD_ATTRS = ("tirx.noalias", "layout_free_buffers")


def workload_module(func) -> tvm.IRModule:
    """The database key of a kernel: the function as the schedule phase sees it, minus bookkeeping attrs."""
    for key in list((func.attrs or {}).keys()):
        if key not in _WORKLOAD_ATTRS:
            func = func.without_attr(key)
    return tvm.IRModule({"main": func})


def records_dir(target_name: str) -> Path | None:
    """The database folder for ``target_name`` if one with both files exists, else None."""
    base = os.environ.get(SCHEDULES_ENV) or Path(__file__).resolve().parents[2] / "schedules"
    folder = Path(base) / target_name
    if (folder / WORKLOADS_FILE).is_file() and (folder / RECORDS_FILE).is_file():
        return folder
    return None


def open_database(folder: str | os.PathLike):
    from tvm.s_tir import meta_schedule as ms

    folder = Path(folder)
    register_intrinsics(folder / RECORDS_FILE)
    return ms.database.JSONDatabase(path_workload=str(folder / WORKLOADS_FILE),
                                    path_tuning_record=str(folder / RECORDS_FILE), allow_missing=False)


def register_intrinsics(records: Path) -> None:
    """Register the tensor intrinsics the records' traces name (the conv's register transposes, output and
    input side): the rules register them on first use, but reading a database parses every trace, and a
    ``tensorize`` of an intrinsic this process has not registered yet fails the whole database."""
    from .transpose import INTRIN_NAME, register_named

    if records.is_file():
        for name in set(INTRIN_NAME.findall(records.read_text())):
            register_named(name)


class TunedRecordRule(ScheduleRule):
    """The best record of the database for this exact kernel, or None."""

    name = "tuned"

    def __init__(self, database):
        self.database = database

    def apply(self, func, target, host):
        return self.database.query_schedule(workload_module(func), target=host, workload_name="main")
