"""``tune_model`` picks up every tunable rule: small models whose kernels fall to the attention, attention +
projection, GEMM+norm, chained-GEMM, pool, depthwise and grouped-conv rules are tuned end to end (real builds and runs, two
candidates per kernel), each such kernel gets records, and the model compiled with the searched picks
replays them and computes what the untuned build computes."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import assert_close, run_vm
from tvm_ascendfuse import compile_model
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.schedule.tuned import RECORDS_FILE, SCHEDULES_ENV, WORKLOADS_FILE, open_database, tile_decision
from tvm_ascendfuse.target import get_target
from tvm_ascendfuse.tune import extract_kernels, tune_model
from tvm_ascendfuse.workloads import bert_layer

pytest.importorskip("cloudpickle")

NPU = get_target("ascend910b")
HOST = NPU.host_target(portable=True)


def searched_picks_only(folder, out):
    """A copy of the database without the rules' default records, so that every kernel's best record is a
    searched pick: a default record is left to the rule at compile time, and this test is about replaying
    what the search found."""
    from tvm.s_tir import meta_schedule as ms

    db = open_database(folder)
    out.mkdir(parents=True)
    picks = ms.database.JSONDatabase(path_workload=str(out / WORKLOADS_FILE),
                                     path_tuning_record=str(out / RECORDS_FILE), allow_missing=True)
    for r in db.get_all_tuning_records():
        if tile_decision(r) != 0:
            picks.commit_tuning_record(ms.database.TuningRecord(
                r.trace, picks.commit_workload(r.workload.mod), r.run_secs, r.target, r.args_info))


def _cnn():
    """Max-pool, then a depthwise conv + ReLU, then a grouped conv + ReLU (16 -> 32 channels on 8x8)."""
    rng = np.random.default_rng(0)

    def w(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype("float32"), name)

    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p", "wd", "bd"], ["d"], group=16, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["d"], ["dr"]),
             helper.make_node("Conv", ["dr", "wg", "bg"], ["g"], group=4, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["g"], ["y"])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 8, 8])],
                              [w("wd", (16, 1, 3, 3)), w("bd", (16,)), w("wg", (32, 4, 3, 3)), w("bg", (32,))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), [(1, 16, 16, 16)]


def _transformer():
    """A BERT layer in small, the attention projection left out of the attention kernel."""
    return bert_layer(seq=8, hidden=32, heads=2, ffn=64), [(1, 8, 32)]


MODELS = {
    # name: (model, switches, the rules its tuned kernels must include)
    "transformer": (_transformer, {"AttentionProjectionFusionPass": "off"},
                    {"attention", "matmul+norm", "chained-matmul"}),
    # records of a rule that rewrites its kernel first (``prepare``) are keyed by the rewritten kernel
    "transformer_projection": (_transformer, {}, {"attention-projection"}),
    "cnn": (_cnn, {}, {"pool", "depthwise-conv2d", "grouped-conv2d"}),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_tune_a_model_with_the_new_rules_and_compile_with_its_records(name, tmp_path, monkeypatch):
    make, switches, rules = MODELS[name]
    model, shapes = make()
    mod = import_onnx(model)
    kernels = [k for k in extract_kernels(mod, NPU, HOST, switches) if k.rule in rules]
    assert {k.rule for k in kernels} == rules and all(k.tunable for k in kernels)
    out = tmp_path / "sched"
    monkeypatch.setattr("tvm_ascendfuse.tune.search.MIN_GAIN", -10.0)   # record the pick whatever the load
    summary = tune_model(mod, trials=2, output=out, kernels=[k.name for k in kernels], switches=switches,
                         portable=True, quiet=True)
    assert {r.rule for r in summary.results} == rules
    assert all(r.status == "tuned" and r.trials == 2 for r in summary.results), summary.table()

    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype("float32") for s in shapes]
    monkeypatch.setenv(SCHEDULES_ENV, str(tmp_path / "nothing"))
    untuned = compile_model(import_onnx(model), target="ascend910b", portable=True, switches=switches)
    searched_picks_only(out / "ascend910b" / "generic", tmp_path / "picks" / "ascend910b" / "generic")
    monkeypatch.setenv(SCHEDULES_ENV, str(tmp_path / "picks"))
    tuned = compile_model(import_onnx(model), target="ascend910b", portable=True, switches=switches)
    applied = list(tuned.report.sections["schedules"].values())
    # (the tune table says which kernel lost its searched candidate, if one did)
    assert applied.count("tuned") == len(kernels), (tuned.report.sections["schedules"], summary.table())
    assert not tuned.report.sections.get("rule_errors")
    assert_close(run_vm(tuned.executable, inputs), run_vm(untuned.executable, inputs),
                               rtol=1e-4, atol=1e-4)
