"""benchmarks/model_benchmark.py and its pieces (profile_kernels on any ONNX file, ort_same_ops) on a tiny
ONNX model: conv + ReLU (conv2d rule), depthwise conv + SiLU + mean over the channels (a generic-rule kernel: the
depthwise rule takes a mean over whole planes after it, not this one), the classifier of one image on the GEMV rule."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

mb = importlib.import_module("model_benchmark")
pk = importlib.import_module("profile_kernels")
same = importlib.import_module("ort_same_ops")

pytest.importorskip("onnxruntime")


def tiny_model(c: int = 8, hw: int = 12, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def init(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype("float32"), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=c),
        helper.make_node("Sigmoid", ["c2"], ["s2"]),
        helper.make_node("Mul", ["c2", "s2"], ["m2"]),
        helper.make_node("ReduceMean", ["m2"], ["p"], axes=[1], keepdims=1),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "w3"], ["y"]),
    ]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
                          initializer=[init("w1", [c, c, 3, 3]), init("b1", [c]), init("w2", [c, 1, 3, 3]),
                                       init("b2", [c]), init("w3", [hw * hw, 16])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def compiled():
    import tvm_ascendfuse as af
    from tvm_ascendfuse.frontend import import_onnx

    model = tiny_model()
    res = af.compile_model(import_onnx(model))
    return model, res, pk.static_kernel_info(res)


def test_static_info_rules_and_constant_inputs(compiled):
    _, _, info = compiled
    rules = sorted(k["rule"] for k in info.values() if k["n_inputs"])
    assert rules == ["conv2d", "gemv", "reduction"]
    dw = next(k for k in info.values() if k["rule"] == "reduction")
    assert "silu" in dw["ops"] and "mean" in dw["ops"]
    # one call: the activation, then the depthwise weight and the bias as constants
    assert dw["n_inputs"] == [3] and dw["const"] == [[False, True, True]]


def test_in_model_times_follow_the_call_order_and_cover_every_kernel(compiled):
    model, res, info = compiled
    x = pk.model_inputs(model)
    alone = pk.record_calls(res.executable, x, set(info))
    timed = pk.in_model_call_times(res.executable, x, set(info), rounds=3)
    assert [s for s, _ in timed] == [s for s, _, _ in alone]     # one entry per call, in the VM's order
    assert all(0 < sec < 1 for _, sec in timed)
    rows = pk.kernel_table(timed, info)
    assert sorted(r.name for r in rows) == sorted({s for s, _ in timed})
    assert sum(r.calls for r in rows) == len(timed)
    assert abs(sum(r.ms for r in rows) - 1e3 * sum(sec for _, sec in timed)) < 1e-9
    assert [r.ms for r in rows] == sorted((r.ms for r in rows), reverse=True)
    assert {r.name for r in pk.profile_in_model(res.executable, x, info, rounds=2)} == {r.name for r in rows}


def test_model_inputs_respect_recorded_vocabulary():
    x = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [1, "seq"])
    m = helper.make_model(helper.make_graph([helper.make_node("Identity", ["ids"], ["y"])], "g", [x], [y]))
    entry = m.metadata_props.add()
    entry.key, entry.value = "ascendfuse.int_input_high", "7"
    (ids,) = pk.model_inputs(m, seed=3, dim=500)
    assert ids.shape == (1, 500) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() == 6          # 500 draws from [0, 7) hit the top value


def test_same_ops_matches_the_depthwise_kernel_to_its_onnx_nodes(compiled):
    model, res, info = compiled
    x = pk.model_inputs(model)
    dw = next(n for n, k in info.items() if k["rule"] == "reduction")
    rows = pk.same_ops_rows(model, x, res.executable, info, [dw], max_calls=1, runs=3)
    (row,) = rows[dw]
    assert row["onnx_inputs"] == ["r1"]
    assert row["onnx_outputs"] == ["p"]              # the kernel ends at the mean; Flatten comes after
    assert sorted(row["onnx_ops"]) == ["Conv", "Mul", "ReduceMean", "Sigmoid"]
    assert row["node_ms"] > 0


def test_matching_prefers_the_earliest_output_and_refuses_constant_tensors():
    # y = Identity(a) has the values of a: an output matches a (the earliest), the input the model input
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    xv = np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, 6.5]], dtype="float32")
    vals = same.OnnxValues(m, {"x": xv}, {6})
    got = same.match_call(vals, [xv], [np.maximum(xv, 0)])
    assert got == {"inputs": ["x"], "outputs": ["a"]}
    assert "constant" in same.match_call(vals, [np.ones((2, 3), "float32")], [np.maximum(xv, 0)])["unmatched"]
    assert "no ONNX tensor" in same.match_call(vals, [xv], [xv * 2])["unmatched"]


def test_rel_err():
    ref = [np.array([1.0, -4.0]), np.array([2.0])]
    assert mb.rel_err([np.array([1.0, -4.0]), np.array([2.0])], ref) == 0.0
    assert mb.rel_err([np.array([1.4, -4.0]), np.array([2.0])], ref) == pytest.approx(0.1)
    assert mb.rel_err([np.array([1.0, -4.0])], ref) is None


def _opts(**kw):
    """The command line's defaults (parsed by the benchmark's own parser), with short timeouts and rounds."""
    opts = mb.build_parser().parse_args(["tiny.onnx", "--no-diagnose", "--round-ms", "1", "--same-ops-calls", "1",
                                         "--compile-timeout", "300", "--default-compile-timeout", "300",
                                         "--run-timeout", "120", "--default-run-timeout", "120",
                                         "--diagnose-step-timeout", "60", "--profile-timeout", "300"])
    for key, value in kw.items():
        setattr(opts, key, value)
    return opts


def test_whole_harness_on_a_tiny_onnx_file(tmp_path):
    """Compiles, agreement, alternating timing rounds, per-kernel profile and ORT on the same ops, each in
    its own process, as the benchmark runs them."""
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), str(path))
    row = mb.benchmark_model(str(path), _opts(bandwidth_gbps=20.0), cache=tmp_path)
    assert row["built_default"] and row["built_ours"], row
    assert row["kernels_ours"] == 3 and row["kernels_default"] > 3
    assert row["launches_per_rule"] == {"conv2d": 1, "reduction": 1, "gemv": 1}
    assert row["agrees_ours"] and row["agrees_default"], row
    assert row["rel_err_ours"] < 1e-4
    assert row["timing"]["rounds"] == 3 and min(row["timing"]["calls_per_round"]["ours"]) >= 5
    assert row["ours_over_ort"] > 0
    assert 0 < row["generic_share"] <= 1 and row["fallback_share"] == 0
    (g,) = row["generic_kernels"]
    assert g["rule"] == "reduction" and g["vs_ort"]["matched"] == 1 and g["vs_ort"]["ratio"] > 0
    text = mb.table([row]) + mb.generic_table([row])
    assert "ok/ok" in text and "reduction" in text
    # the weights' read rate against the bandwidth given: bytes of the initializers / our time
    weights = sum(numpy_helper.to_array(t).nbytes for t in tiny_model().graph.initializer)
    assert row["weights_mb"] == round(weights / 1e6, 1)
    assert row["weights_gbps"] == pytest.approx(weights / (row["ours_ms"] * 1e-3) / 1e9, rel=0.01, abs=0.1)
    assert row["bandwidth_fraction"] == pytest.approx(row["weights_gbps"] / 20.0, abs=0.01)
    assert "of the host's 20.0 GB/s" in text


def test_host_bandwidth_is_a_rate():
    assert 0.1 < mb.host_bandwidth_gbps(mb=16, rounds=2) < 10000


def test_compile_timeout_is_reported_not_raised(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), str(path))
    res = mb.run_job("compile", path, tmp_path, timeout=1.0, which="ours")   # the import alone takes longer
    assert res == {"timeout": 1.0}
    assert mb._compile_cell(res) == {"built": False, "error": "compile > 1 s (killed)"}


def test_a_bad_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    res = mb.run_job("compile", bad, tmp_path, timeout=120, which="ours")
    assert "error" in res and "\n" not in res["error"] and "not a readable ONNX model" in res["error"]


def test_diagnosis_times_phases_and_kernels_and_names_a_hang(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), str(path))
    d = mb.diagnose(path, tmp_path, step_timeout=120)
    assert {"graph_fusion", "ub_fusion", "schedule", "lowering"} <= set(d["phases"])
    assert d["kernels_built"] >= 3 and not d["hung"] and not d["failed"]
    assert {k["rule"] for k in d["slowest_kernels"]} >= {"conv2d", "reduction", "gemv"}
    # nothing answers within 10 ms (the process is still importing TVM): killed, named, not raised
    hung = mb.diagnose(path, tmp_path, step_timeout=0.01, max_restarts=0)["hung"]
    assert hung and hung[0]["over_s"] == 0.01


def test_family_names_depthwise_convs_and_drops_numbering():
    g = {"ops": ["conv2d12", "add3", "relax.nn.silu", "silu", "mean2"], "shapes": "1x8x4x4 8x1x5x5 1x8x1x1"}
    assert mb.family(g) == "depthwise_conv2d5x5+add+nn.silu+silu+mean"
    assert mb.family({"ops": ["take"], "shapes": "10x4 1x3 1x3x4"}) == "take"
    assert mb.family({"ops": ["conv2d3", "relu"], "shapes": "1x64x8x8 64x16x3x3 1x64x8x8"}) == "grouped_conv2d3x3+relu"
    assert mb.family({"ops": ["conv2d3"], "shapes": "1x64x8x8 32x64x1x1 1x32x8x8"}) == "conv2d"


def test_a_subgraph_reaching_past_the_kernel_is_refused():
    assert pk.overreach(["concatenate4"], ["Concat"]) is None
    assert pk.overreach(["matmul2", "add"], ["MatMul", "MatMul", "MatMul", "Add"]) is None   # merged Q|K|V
    assert "2 Conv/MatMul nodes for 0" in pk.overreach(["concatenate4"], ["Conv", "Relu", "Conv", "Concat"])
    rows = [{"kernel": "k", "node_ms": 1.0, "wall_ms": 1.2, "onnx_ops": ["Conv", "Concat"], "ort_nodes": []}]
    assert pk.same_ops_summary(0.5, rows)["ratio"] == 0.5
    s = pk.same_ops_summary(0.5, rows, kernel_ops=["concatenate"])
    assert s["ratio"] is None and s["matched"] == 0 and "twin" in s["why"]


def test_conv_keys_line_up_dense_and_depthwise_convs_with_ort(compiled):
    """Each conv kernel is keyed (data shape, weight shape) like ORT's Conv nodes, the depthwise one (weight
    C x 1 x KH x KW) included, so the per-class table sets ours beside ORT's node time for both."""
    _, _, info = compiled
    keys = {tuple(tuple(s) for s in v["conv_key"]) for v in info.values() if v["conv_key"] is not None}
    assert ((1, 8, 12, 12), (8, 8, 3, 3)) in keys
    assert ((1, 8, 12, 12), (8, 1, 3, 3)) in keys
