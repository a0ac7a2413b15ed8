"""A MetaSchedule record for a kernel in schedules/<target>/<cpu>/ wins over the built-in rule for that kernel;
records tuned for another CPU are not applied, and the report says so."""

import pytest
import tvm
from tvm import relax, s_tir, tirx
from tvm.s_tir import meta_schedule as ms

from tests.helpers import assert_same_numbers
from tvm_ascendfuse.analysis.ub_usage import normalize_scope_aliases
from tvm_ascendfuse.schedule.fast_math import use_fast_math
from tvm_ascendfuse.schedule.tuned import (
    RECORDS_FILE,
    SCHEDULES_ENV,
    WORKLOADS_FILE,
    find_records,
    host_cpu,
    records_dir,
    workload_module,
)

OTHER_CPU = "znver3"     # a real LLVM CPU; the tests compile for generic x86-64 (portable), never for it


def mlp_layer():
    bb = relax.BlockBuilder()
    x, w, b = (relax.Var(n, relax.TensorType(s, "float32")) for n, s in [("x", (16, 32)), ("w", (32, 48)), ("b", (48,))])
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            o = bb.emit_output(relax.op.nn.relu(relax.op.add(relax.op.matmul(x, w), b)))
        bb.emit_func_output(o)
    return bb.get()


@pytest.fixture(scope="module")
def untuned():
    """The layer compiled with the rules (records of this module's tests live in their own folders)."""
    mod = mlp_layer()
    first = assert_same_numbers(mod)
    assert list(first.report.sections["schedules"].values()) == ["matmul"]
    assert "tuning" not in first.report.sections or first.report.sections["tuning"].get("records") is None
    return mod, first


def write_record(folder, first, record_target, decision=None):
    """A "tuned" schedule (any valid trace on the kernel exactly as the schedule phase sees it: the matmul
    loop made parallel) recorded as measured on ``record_target``; with ``decision``, the trace samples a
    tile candidate first, as a tunable rule's traces do (0: the rule's own default). Returns the kernel's
    name."""
    seen = relax.transform.AttachAttrLayoutFreeBuffers()(first.fused_module)   # as the schedule phase sees it
    (name, func), = [(gv.name_hint, f) for gv, f in seen.functions.items() if isinstance(f, tirx.PrimFunc)]
    workload_mod = workload_module(use_fast_math(normalize_scope_aliases(func)))
    sch = s_tir.Schedule(workload_mod)
    if decision is not None:
        sch.sample_categorical([0, 1], [0.5, 0.5], decision=decision)
    block = sch.get_sblock("matmul")
    sch.parallel(sch.get_loops(block)[0])
    folder.mkdir(parents=True)
    db = ms.database.JSONDatabase(path_workload=str(folder / WORKLOADS_FILE),
                                  path_tuning_record=str(folder / RECORDS_FILE), allow_missing=True)
    workload = db.commit_workload(workload_mod)
    db.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, workload, [1e-3], record_target, ms.arg_info.ArgInfo.from_prim_func(workload_mod["main"])))
    return name


def test_tuned_record_replaces_rule(tmp_path, monkeypatch, untuned):
    mod, first = untuned
    cpu = host_cpu(first.host_target)
    assert cpu == "generic"                                          # portable build: no mcpu
    name = write_record(tmp_path / "ascend910b" / cpu, first, first.host_target)

    monkeypatch.setenv(SCHEDULES_ENV, str(tmp_path))
    assert records_dir("ascend910b", cpu) == tmp_path / "ascend910b" / cpu
    assert records_dir("ascend310p", cpu) is None and records_dir("ascend910b", OTHER_CPU) is None
    tuned = assert_same_numbers(mod)
    (kernel, rule), = tuned.report.sections["schedules"].items()      # kernel: final name (may be suffixed)
    assert rule == "tuned" and kernel.startswith(name)
    script = tuned.scheduled_module[kernel].script()
    assert "T.parallel" in script and "local.UB" not in script      # the record's schedule, not the rule's
    tuning = tuned.report.sections["tuning"]
    assert tuning == {"cpu": cpu, "records": str(tmp_path / "ascend910b" / cpu), "notes": [], "kernels_tuned": 1}


@pytest.mark.parametrize("decision, rule", [(1, "tuned"), (0, "matmul")])
def test_a_record_of_the_rules_own_default_is_left_to_the_rule(tmp_path, monkeypatch, untuned, decision, rule):
    """The search kept the default (decision 0) as the best record: the rule builds its current default
    rather than replaying the one recorded, so an improved rule is not masked by an old record."""
    mod, first = untuned
    cpu = host_cpu(first.host_target)
    write_record(tmp_path / "ascend910b" / cpu, first, first.host_target, decision=decision)
    monkeypatch.setenv(SCHEDULES_ENV, str(tmp_path))
    result = assert_same_numbers(mod)
    (kernel, picked), = result.report.sections["schedules"].items()
    assert picked == rule
    assert result.report.sections["tuning"]["kernels_tuned"] == (rule == "tuned")
    notes = result.report.sections.get("schedule_notes", {}).get(kernel, [])
    assert any("rule's own default" in n for n in notes) == (decision == 0), notes


def test_records_for_another_cpu_are_not_applied(tmp_path, monkeypatch, untuned):
    """A database tuned on another CPU (its folder says so) is left out with a note; so is a flat folder
    that names no CPU. The kernel keeps the rule's schedule."""
    mod, first = untuned
    other = tvm.target.Target({**first.host_target.export(), "mcpu": OTHER_CPU})
    assert host_cpu(other) == OTHER_CPU
    write_record(tmp_path / "ascend910b" / OTHER_CPU, first, other)
    write_record(tmp_path / "ascend910b" / "flat", first, other)
    (tmp_path / "ascend910b" / "flat").rename(tmp_path / "flat")
    for f in (tmp_path / "flat").iterdir():                       # the old layout: files in <target>/ itself
        f.rename(tmp_path / "ascend910b" / f.name)

    monkeypatch.setenv(SCHEDULES_ENV, str(tmp_path))
    folder, notes = find_records("ascend910b", "generic")
    assert folder is None and len(notes) == 2
    result = assert_same_numbers(mod)
    assert list(result.report.sections["schedules"].values()) == ["matmul"]
    tuning = result.report.sections["tuning"]
    assert tuning["records"] is None and tuning["kernels_tuned"] == 0
    assert any(f"for CPU '{OTHER_CPU}', this build is for 'generic': not applied" in n for n in tuning["notes"])
    assert any("name no CPU" in n for n in tuning["notes"])


def test_a_record_measured_on_another_cpu_is_declined_with_a_note(tmp_path, monkeypatch, untuned):
    """Keyed by folder for this CPU, but the record itself says it was measured on another: not applied."""
    mod, first = untuned
    other = tvm.target.Target({**first.host_target.export(), "mcpu": OTHER_CPU})
    write_record(tmp_path / "ascend910b" / "generic", first, other)

    monkeypatch.setenv(SCHEDULES_ENV, str(tmp_path))
    result = assert_same_numbers(mod)
    (kernel, rule), = result.report.sections["schedules"].items()
    assert rule == "matmul"
    notes = result.report.sections["schedule_notes"][kernel]
    assert any(n.startswith("tuned: the record was tuned for CPU 'znver3'") for n in notes), notes
    assert result.report.sections["tuning"]["kernels_tuned"] == 0


def test_no_database_no_tuned_rule(tmp_path, monkeypatch):
    monkeypatch.setenv(SCHEDULES_ENV, str(tmp_path))
    (tmp_path / "ascend910b" / "generic").mkdir(parents=True)
    (tmp_path / "ascend910b" / "generic" / WORKLOADS_FILE).write_text("")
    assert records_dir("ascend910b", "generic") is None      # both files are needed
    assert find_records("ascend910b", "generic") == (None, [])


def test_the_database_is_opened_only_for_a_kernel_it_holds(tmp_path, untuned):
    """Opening a database parses every workload in it; a kernel whose structural hash is not among the
    workloads' is answered from the hashes alone."""
    from tvm_ascendfuse.schedule.tuned import LazyDatabase

    mod, first = untuned
    folder = tmp_path / "ascend910b" / "generic"
    write_record(folder, first, first.host_target)
    db = LazyDatabase(folder)
    other = workload_module(tirx.PrimFunc([], tirx.Evaluate(0)))
    assert not db.has_workload(other) and db._db is None and len(db.hashes()) == 1
    seen = relax.transform.AttachAttrLayoutFreeBuffers()(first.fused_module)
    (func,) = [f for f in seen.functions.values() if isinstance(f, tirx.PrimFunc)]
    assert db.has_workload(workload_module(use_fast_math(normalize_scope_aliases(func)))) and db._db is not None


def test_records_naming_the_dot_intrinsics_register_them_in_a_fresh_process(tmp_path):
    """The int8 and bf16 dot products are registered on first use, not at import: a database whose traces
    tensorize with them registers them before its traces are parsed (else the whole database fails)."""
    import subprocess
    import sys

    from tvm_ascendfuse.schedule.bf16_dot import DOT_16x2_BF16
    from tvm_ascendfuse.schedule.int8_dot import DOT_16x4_U8S8

    records = tmp_path / "records.json"
    records.write_text(f'["Tensorize", "{DOT_16x4_U8S8}"]\n["Tensorize", "{DOT_16x2_BF16}"]\n')
    code = f"""
from pathlib import Path
from tvm.s_tir import TensorIntrin
import tvm_ascendfuse
from tvm_ascendfuse.schedule.tuned import register_intrinsics
names = {[DOT_16x4_U8S8, DOT_16x2_BF16]!r}
def known(n):
    try:
        TensorIntrin.get(n)
        return True
    except ValueError:
        return False
before = [known(n) for n in names]
register_intrinsics(Path({str(records)!r}))
print(before, [known(n) for n in names])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[False, False] [True, True]", out
