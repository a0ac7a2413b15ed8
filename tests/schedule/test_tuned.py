"""A MetaSchedule record for a kernel in schedules/<target>/ wins over the built-in rule for that kernel."""

from tvm import relax, s_tir, tirx
from tvm.s_tir import meta_schedule as ms

from tests.helpers import assert_same_numbers
from tvm_ascendfuse.analysis.ub_usage import normalize_scope_aliases
from tvm_ascendfuse.schedule.fast_math import use_fast_math
from tvm_ascendfuse.schedule.tuned import RECORDS_FILE, SCHEDULES_ENV, WORKLOADS_FILE, records_dir, workload_module


def mlp_layer():
    bb = relax.BlockBuilder()
    x, w, b = (relax.Var(n, relax.TensorType(s, "float32")) for n, s in [("x", (16, 32)), ("w", (32, 48)), ("b", (48,))])
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            o = bb.emit_output(relax.op.nn.relu(relax.op.add(relax.op.matmul(x, w), b)))
        bb.emit_func_output(o)
    return bb.get()


def test_tuned_record_replaces_rule(tmp_path, monkeypatch):
    mod = mlp_layer()
    first = assert_same_numbers(mod)
    seen = relax.transform.AttachAttrLayoutFreeBuffers()(first.fused_module)   # as the schedule phase sees it
    (name, func), = [(gv.name_hint, f) for gv, f in seen.functions.items() if isinstance(f, tirx.PrimFunc)]
    assert list(first.report.sections["schedules"].values()) == ["matmul"]

    # a "tuned" schedule: any valid trace on the kernel exactly as the schedule phase sees it
    workload_mod = workload_module(use_fast_math(normalize_scope_aliases(func)))
    sch = s_tir.Schedule(workload_mod)
    block = sch.get_sblock("matmul")
    sch.parallel(sch.get_loops(block)[0])
    folder = tmp_path / "ascend910b"
    folder.mkdir()
    db = ms.database.JSONDatabase(path_workload=str(folder / WORKLOADS_FILE),
                                  path_tuning_record=str(folder / RECORDS_FILE), allow_missing=True)
    workload = db.commit_workload(workload_mod)
    db.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, workload, [1e-3], first.host_target, ms.arg_info.ArgInfo.from_prim_func(workload_mod["main"])))

    monkeypatch.setenv(SCHEDULES_ENV, str(tmp_path))
    assert records_dir("ascend910b") == folder and records_dir("ascend310p") is None
    tuned = assert_same_numbers(mod)
    (kernel, rule), = tuned.report.sections["schedules"].items()      # kernel: final name (may be suffixed)
    assert rule == "tuned" and kernel.startswith(name)
    script = tuned.scheduled_module[kernel].script()
    assert "T.parallel" in script and "local.UB" not in script      # the record's schedule, not the rule's


def test_no_database_no_tuned_rule(tmp_path, monkeypatch):
    monkeypatch.setenv(SCHEDULES_ENV, str(tmp_path))
    (tmp_path / "ascend910b").mkdir()
    (tmp_path / "ascend910b" / WORKLOADS_FILE).write_text("")
    assert records_dir("ascend910b") is None      # both files are needed
