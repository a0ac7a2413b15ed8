"""Tuned records: a MetaSchedule database for the target and host CPU wins over the built-in rules where it
matches.

The database lives in ``schedules/<target name>/<cpu>/`` (``database_workload.json`` and
``database_tuning_record.json``) of a source checkout, or under the folder named by the environment variable
``ASCENDFUSE_SCHEDULES``. ``<cpu>`` is the LLVM CPU the kernels are built for (the host target's ``mcpu``,
e.g. ``znver4``; ``generic`` for ``--portable`` builds): a record holds that CPU's vector widths and register
blocks, so records for another CPU are not applied, and the report's ``tuning`` section says which were left
out. A best record that is the rule's own default (tile decision 0) is not replayed: the rule builds its
current default. A workload is a kernel as the schedule phase sees it (after FuseTIR and the fast-math rewrite), so
records tuned on these kernels match them structurally; kernels without a record keep the rules.
"""

from __future__ import annotations

import os
from pathlib import Path

import tvm
import tvm_ffi

from .base import Declined, ScheduleRule, Scheduled
from .common import new_schedule

SCHEDULES_ENV = "ASCENDFUSE_SCHEDULES"
WORKLOADS_FILE = "database_workload.json"
RECORDS_FILE = "database_tuning_record.json"
GENERIC_CPU = "generic"      # the key of records built without an mcpu (``--portable``)


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


def host_cpu(host) -> str:
    """The CPU a host target generates code for (its ``mcpu``, ``generic`` without one): the records' key."""
    if host is None:
        return GENERIC_CPU
    host = host if isinstance(host, tvm.target.Target) else tvm.target.Target(host)
    mcpu = host.attrs.get("mcpu") if host.attrs is not None else None
    return str(mcpu) if mcpu else GENERIC_CPU


def schedules_base() -> Path:
    return Path(os.environ.get(SCHEDULES_ENV) or Path(__file__).resolve().parents[2] / "schedules")


def _has_database(folder: Path) -> bool:
    return (folder / WORKLOADS_FILE).is_file() and (folder / RECORDS_FILE).is_file()


def records_dir(target_name: str, cpu: str) -> Path | None:
    """The database folder for ``target_name`` on ``cpu`` if one with both files exists, else None."""
    folder = schedules_base() / target_name / cpu
    return folder if _has_database(folder) else None


def find_records(target_name: str, cpu: str) -> tuple[Path | None, list[str]]:
    """The database folder for this target and CPU (or None) and a note for each database of the target that
    is left out because it was tuned for another CPU (or names none)."""
    base = schedules_base() / target_name
    notes = []
    if base.is_dir():
        for other in sorted(p for p in base.iterdir() if p.is_dir() and p.name != cpu and _has_database(p)):
            notes.append(f"records in {other} are for CPU '{other.name}', this build is for '{cpu}': not applied")
        if _has_database(base):
            notes.append(f"records in {base} name no CPU (they belong in {base / cpu} when tuned for this "
                         f"CPU): not applied")
    return records_dir(target_name, cpu), notes


def tuned_rules(target_name: str, host, prepares=()) -> tuple[list, dict]:
    """The tuned-record rule for this target and host CPU (or none) and what the report's ``tuning`` section
    says about it (empty when there is nothing to say). ``prepares``: the rules' ``prepare`` rewrites (records
    of such a rule are keyed by the prepared kernel, ``base.ScheduleRule.prepare``)."""
    cpu = host_cpu(host)
    folder, notes = find_records(target_name, cpu)
    if folder is None and not notes:
        return [], {}
    info = {"cpu": cpu, "records": str(folder) if folder is not None else None, "notes": notes}
    return ([TunedRecordRule(LazyDatabase(folder), cpu, prepares)] if folder is not None else []), info


class LazyDatabase:
    """A database folder opened only when a kernel's structural hash is one of its workloads'. Opening a
    MetaSchedule JSON database parses every workload it holds (a tenth of a second for the records shipped
    here), which a model none of whose kernels has a record should not pay: the hashes are the first field of
    each line of the workloads file, read without parsing the modules."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self._db = None
        self._hashes = None

    def hashes(self) -> set:
        if self._hashes is None:
            self._hashes = set()
            with open(self.folder / WORKLOADS_FILE) as f:
                for line in f:
                    if line.startswith('["'):
                        self._hashes.add(line[2:line.index('"', 2)])
        return self._hashes

    def has_workload(self, mod) -> bool:
        if str(tvm_ffi.structural_hash(mod)) not in self.hashes():
            return False
        return self.database().has_workload(mod)

    def database(self):
        if self._db is None:
            self._db = open_database(self.folder)
        return self._db

    def query_tuning_record(self, *args, **kwargs):
        return self.database().query_tuning_record(*args, **kwargs)

    def query_schedule(self, *args, **kwargs):
        return self.database().query_schedule(*args, **kwargs)


def open_database(folder: str | os.PathLike, allow_missing: bool = False):
    from tvm.s_tir import meta_schedule as ms

    folder = Path(folder)
    register_intrinsics(folder / RECORDS_FILE)
    return ms.database.JSONDatabase(path_workload=str(folder / WORKLOADS_FILE),
                                    path_tuning_record=str(folder / RECORDS_FILE), allow_missing=allow_missing)


def register_intrinsics(records: Path) -> None:
    """Register the tensor intrinsics the records' traces name (the conv's register transposes, output and
    input side; the int8 and bf16 dot products): the rules register them on first use, but reading a
    database parses every trace, and a ``tensorize`` of an intrinsic this process has not registered yet
    fails the whole database."""
    from .bf16_dot import DOT_16x2_BF16, dot_16x2_bf16
    from .int8_dot import DOT_16x4_U8S8, dot_16x4_u8s8
    from .transpose import INTRIN_NAME, register_named

    if records.is_file():
        text = records.read_text()
        for name in set(INTRIN_NAME.findall(text)):
            register_named(name)
        for name, register in ((DOT_16x4_U8S8, dot_16x4_u8s8), (DOT_16x2_BF16, dot_16x2_bf16)):
            if name in text:
                register()


class TunedRecordRule(ScheduleRule):
    """The best record of the database for this exact kernel, or None. A record tuned for another CPU than
    ``cpu`` is not applied (declined with the reason, which the report's ``schedule_notes`` show)."""

    name = "tuned"

    def __init__(self, database, cpu: str | None = None, prepares=()):
        self.database = database
        self.cpu = cpu
        self.prepares = tuple(prepares)

    def apply_with_note(self, func, target, host):
        workload = workload_module(func)
        if not self.database.has_workload(workload):
            # a rule that rewrites a kernel before scheduling it was tuned on the rewritten kernel
            for prepare in self.prepares:
                prepared = workload_module(prepare(func))
                if self.database.has_workload(prepared):
                    workload = prepared
                    break
            else:
                return None
        record = self.database.query_tuning_record(workload, target=host, workload_name="main")
        if record is None:
            return None
        if self.cpu is not None:
            tuned_for = host_cpu(record.target)
            if tuned_for != self.cpu:
                return Declined(f"the record was tuned for CPU '{tuned_for}', this build is for "
                                f"'{self.cpu}': not applied")
        if tile_decision(record) == DEFAULT_DECISION:
            # The search found nothing faster than the rule's own choice. Replaying that trace would freeze
            # the rule as it was when the record was made; the rule builds its current default instead, so
            # an improved rule is not masked by records that merely confirmed the old one.
            return Declined("the best record is the rule's own default: the rule schedules the kernel")
        sch = self.database.query_schedule(workload, target=host, workload_name="main")
        return None if sch is None else Scheduled(finish_traced(sch))


DEFAULT_DECISION = 0      # the tile decision of a rule's own choice (``tunable``: the rule's default first)


def tile_decision(record) -> int | None:
    """Index of the tile candidate a record sampled (0: the rule's default), None without a decision."""
    for inst, decision in record.trace.decisions.items():
        if inst.kind.name == "SampleCategorical":
            return int(decision)
    return None


def finish_traced(sch):
    """A traced schedule as the kernel the rule would have built: the rewrites a trace cannot record (the
    depthwise rule's register-transposed input copies, ``transpose.rewrite_transposed_stages``, and its
    border-only zero fills, ``border_fill.rewrite_border_fills``) applied to the blocks the schedule marked
    for them. Used on a record's schedule and on every measured candidate."""
    from tvm import s_tir

    from .border_fill import rewrite_border_fills
    from .transpose import rewrite_transposed_stages

    func, rewritten = rewrite_transposed_stages(sch.mod["main"])
    func, bordered = rewrite_border_fills(func)
    return new_schedule(tvm.IRModule({"main": func})) if rewritten or bordered else sch
