"""``ascendfuse tune``: the database it writes is the one compile then uses, numbers unchanged; bad input is
one line and exit code 2."""

import json

import numpy as np
import onnx
import pytest

from tests.helpers import assert_close, run_vm
from tvm_ascendfuse import compile_model
from tvm_ascendfuse.cli import main
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.schedule.tuned import RECORDS_FILE, SCHEDULES_ENV, WORKLOADS_FILE, open_database
from tvm_ascendfuse.tune import tile_decision, worth_recording
from tvm_ascendfuse.workloads import mlp3

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def linear_model(tmp_path_factory):
    """Linear(48->48)+bias+ReLU on 20 rows: one kernel, which the Matmul rule schedules."""
    path = tmp_path_factory.mktemp("model") / "linear.onnx"
    onnx.save(mlp3(rows=20, width=48, depth=1), str(path))
    return path


def test_tune_writes_the_database_compile_uses(linear_model, tmp_path, capsys, monkeypatch):
    out = tmp_path / "sched"
    # record the searched pick whatever its speed (whether it beats the default depends on the machine's
    # load; the margin has its own test below): the database must then hold the default and that pick
    monkeypatch.setattr("tvm_ascendfuse.tune.search.MIN_GAIN", -10.0)
    assert main(["tune", str(linear_model), "--target", "ascend910b", "--trials", "2", "-o", str(out),
                 "--portable"]) == 0
    printed = capsys.readouterr().out
    assert "matmul" in printed and "default us" in printed
    folder = out / "ascend910b" / "generic"                    # --portable: records for no particular CPU
    records = [json.loads(line) for line in (folder / RECORDS_FILE).read_text().splitlines() if line.strip()]
    # (the table says what was lost if a candidate failed to build or run)
    assert (folder / WORKLOADS_FILE).is_file() and len(records) == 2, printed
    assert all(r[1][1][0] < 1e9 for r in records)              # every candidate built and ran
    decisions = sorted(tile_decision(r) for r in open_database(folder).get_all_tuning_records())
    assert decisions[0] == 0 and len(set(decisions)) == 2       # the default, re-measured beside the other

    model = onnx.load(str(linear_model))
    x = np.random.default_rng(0).standard_normal((20, 48)).astype("float32")
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    monkeypatch.setenv(SCHEDULES_ENV, str(out))
    result = compile_model(import_onnx(model), target="ascend910b", portable=True)
    best = open_database(folder).get_top_k(open_database(folder).get_all_tuning_records()[0].workload, 1)[0]
    # the best record is applied unless it is the rule's own default (the rule then builds it itself)
    expected_rule = "matmul" if tile_decision(best) == 0 else "tuned"
    assert list(result.report.sections["schedules"].values()) == [expected_rule]
    assert_close(run_vm(result.executable, [x]), expected, rtol=1e-4, atol=1e-4)

    monkeypatch.setenv(SCHEDULES_ENV, str(tmp_path / "nothing"))
    untuned = compile_model(import_onnx(model), target="ascend910b", portable=True)
    assert list(untuned.report.sections["schedules"].values()) == ["matmul"]


@pytest.mark.parametrize("trials", ["0", "-2"])
def test_bad_trial_count(linear_model, tmp_path, capsys, trials):
    assert main(["tune", str(linear_model), "--trials", trials, "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--trials must be a positive number" in err and trials in err
    assert not (tmp_path / "o").exists()


def test_unknown_kernel_lists_the_valid_ones(linear_model, tmp_path, capsys):
    assert main(["tune", str(linear_model), "--trials", "2", "--kernels", "no_such_kernel",
                 "-o", str(tmp_path / "o"), "--portable"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown kernel 'no_such_kernel'" in err and "fused_relax_matmul_relax_add_relax_nn_relu" in err
    assert not (tmp_path / "o").exists()


def test_model_without_tunable_kernels(tmp_path, capsys):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert main(["tune", str(path), "--trials", "2", "-o", str(tmp_path / "o")]) == 2
    assert "no kernel of this model uses a tunable rule" in capsys.readouterr().err


def test_missing_tuning_packages_are_named(linear_model, tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cloudpickle" else real(name, *a))
    assert main(["tune", str(linear_model), "--trials", "2", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "cloudpickle" in err and "tvm_ascendfuse[tune]" in err
    assert not (tmp_path / "o").exists()


def test_tune_a_conv_kernel_and_compile_with_its_record(tmp_path, capsys, monkeypatch):
    """Conv3x3(8->16)+BN+ReLU on 12x12: the Conv2d rule's space is searched, the best record is the one
    compile applies, numbers unchanged."""
    from tvm_ascendfuse.workloads import conv_bn_relu

    model = conv_bn_relu(in_channels=8, out_channels=16, hw=12)
    path = tmp_path / "conv.onnx"
    onnx.save(model, str(path))
    out = tmp_path / "sched"
    monkeypatch.setattr("tvm_ascendfuse.tune.search.MIN_GAIN", -10.0)   # record every pick, slower ones too
    assert main(["tune", str(path), "--trials", "3", "-o", str(out), "--portable"]) == 0
    assert "conv2d" in capsys.readouterr().out
    records = list(open_database(out / "ascend910b" / "generic").get_all_tuning_records())
    decisions = sorted(tile_decision(r) for r in records)
    assert decisions[0] == 0 and len(set(decisions)) == 3 and all(float(r.run_secs[0]) < 1e9 for r in records)

    x = np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype("float32")
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {model.graph.input[0].name: x})
    monkeypatch.setenv(SCHEDULES_ENV, str(out))
    result = compile_model(import_onnx(model), target="ascend910b", portable=True)
    best = open_database(out / "ascend910b" / "generic").get_top_k(records[0].workload, 1)[0]
    if tile_decision(best) == 0:              # the default won: the rule builds it, no record replayed
        assert "tuned" not in result.report.sections["schedules"].values()
        assert_close(run_vm(result.executable, [x]), expected, rtol=1e-4, atol=1e-4)
        return
    assert "tuned" in result.report.sections["schedules"].values()
    script = next(iter(f for f in result.scheduled_module.functions.values()
                       if "ascendfuse.schedule" in f.script())).script()
    note = next(i.inputs[-1] for i in best.trace.insts if i.kind.name == "Annotate"
                and str(i.attrs[0]) == "ascendfuse.schedule")
    assert str(note).strip('"') in script                        # the record's tiles, not the rule's
    assert_close(run_vm(result.executable, [x]), expected, rtol=1e-4, atol=1e-4)


def test_a_tuned_pick_is_recorded_only_when_it_beats_the_default_by_the_margin():
    timed = [(0, 1.00e-3, "default"), (3, 0.99e-3, "noise"), (5, 0.90e-3, "win"), (7, 1.2e-3, "slower")]
    assert [r for r, _ in worth_recording(timed, min_gain=0.03)] == ["default", "win"]
    # the default failed to run: nothing shows that a pick beats it, so nothing is recorded
    assert worth_recording(timed[1:], min_gain=0.03) == []


def test_a_killed_whole_model_run_resumes(tmp_path, capsys, monkeypatch):
    """Two distinct kernels (chained GEMMs off): the process is killed (SIGKILL, with its MetaSchedule
    workers) once the first kernel is recorded; the rerun keeps that kernel, reuses the untuned timings,
    tunes the other, and the model compiled with the records gives ORT's numbers."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.tune.models import mlp

    model = mlp([32, 96, 24], rows=16)
    path, switch = tmp_path / "mlp.onnx", tmp_path / "switch.cfg"
    onnx.save(model, str(path))
    switch.write_text("ChainedGemmFusionPass:off\n")
    out = tmp_path / "sched"
    argv = ["tune", str(path), "--trials", "3", "-o", str(out), "--portable", "--fusion-switch", str(switch)]
    records = out / "ascend910b" / "generic" / RECORDS_FILE
    proc = subprocess.Popen([sys.executable, "-m", "tvm_ascendfuse.cli", *argv, "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if records.is_file() and records.read_text().strip():
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(30)
        proc.stderr.close()
    first = {json.loads(line)[0] for line in records.read_text().splitlines() if line.strip()}
    assert len(first) == 1                                         # one kernel recorded, the other not

    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "timing the" not in captured.err                        # the untuned timings came from the work dir
    table = captured.out
    assert table.count("already tuned") == 1 and "3 candidates measured on this machine (6 with earlier" in table
    summary = json.loads((out / "ascend910b" / "generic" / "work" / "summary.json").read_text())
    shares = [r["share"] for r in summary["results"]]
    assert shares == sorted(shares, reverse=True) and sum(shares) == pytest.approx(1.0)
    assert [r["status"] for r in summary["results"]].count("tuned") == 1

    x = np.random.default_rng(0).standard_normal((16, 32)).astype("float32")
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    monkeypatch.setenv(SCHEDULES_ENV, str(out))
    result = compile_model(import_onnx(model), target="ascend910b", portable=True,
                           switches={"ChainedGemmFusionPass": "off"})
    notes = result.report.sections.get("schedule_notes", {})
    assert len(result.report.sections["schedules"]) == 2
    for kernel, rule in result.report.sections["schedules"].items():
        # both kernels have records: the best applies unless it is the rule's own default (built by the rule)
        assert rule == "tuned" or any("rule's own default" in n for n in notes.get(kernel, [])), (kernel, rule)
    assert_close(run_vm(result.executable, [x]), expected, rtol=1e-4, atol=1e-4)
