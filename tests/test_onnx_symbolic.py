"""Import with a symbolic dimension kept symbolic (``onnx_symbolic.SymbolicShapeImporter``, used by
``import_onnx``): an LLM decode step whose KV cache length ``past`` is symbolic imports with ``past`` one
``tirx.Var`` in ``main``'s signature and every shape derived from it, compiles with our pipeline, and matches
onnxruntime at several cache lengths; caches of contradicting lengths are refused naming the input."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

from tests.helpers import assert_close, compile_ours, run_vm
from tests.shape_models import _c, decode_step, ort_run
from tvm_ascendfuse.cli import summary_text
from tvm_ascendfuse.errors import UnsupportedOpError
from tvm_ascendfuse.frontend import import_onnx

pytest.importorskip("onnxruntime")

HIDDEN, KV_HEADS, HEAD_DIM = 32, 2, 8


def _feeds(length: int, seed: int = 0, v_length: int | None = None) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((1, 1, HIDDEN)).astype("float32"),
            "past_k": rng.standard_normal((1, KV_HEADS, length, HEAD_DIM)).astype("float32"),
            "past_v": rng.standard_normal((1, KV_HEADS, v_length or length, HEAD_DIM)).astype("float32")}


def _tir_var_names(func: relax.Function) -> set:
    """Names of every symbolic dim in the types of ``func``'s params and bindings."""
    names = set()
    for p in func.params:
        names |= {v.name for v in relax.analysis.tir_vars_in_type(p.ty)}
    for block in func.body.blocks:
        for b in block.bindings:
            names |= {v.name for v in relax.analysis.tir_vars_in_type(b.var.ty)}
    return names


@pytest.fixture(scope="module")
def decode():
    model = decode_step(hidden=HIDDEN, kv_heads=KV_HEADS, head_dim=HEAD_DIM)
    mod = import_onnx(model)
    return model, mod, compile_ours(mod)


def test_tvm_alone_rejects_the_decode_step():
    """What the repair is for: TVM 0.27 makes ``Add([0], past)`` a scalar, then cannot unsqueeze it."""
    with pytest.raises(UnsupportedOpError, match="Unsqueeze axis 1 is out of range for rank 1"):
        import_onnx(decode_step(hidden=HIDDEN, kv_heads=KV_HEADS, head_dim=HEAD_DIM), fold_shapes=False)


def test_past_stays_one_symbolic_var(decode):
    _, mod, _ = decode
    main = mod["main"]
    k, v = (p.ty.shape.values[2] for p in main.params[1:])
    assert isinstance(k, tvm.tirx.Var) and k.name == "past" and k.same_as(v)
    # the mask, the key positions (Range) and the grouped-query repeat are all in terms of past: no length
    # variable of its own (TVM's Range makes one, "range_len_0", which is not past + 1)
    assert _tir_var_names(main) == {"past"}
    outs = main.ret_ty.fields
    assert [int(d) for d in outs[0].shape.values] == [1, 1, HIDDEN]
    for out in outs[1:]:
        assert str(out.shape.values[2]) == str(k + 1)


@pytest.mark.parametrize("length", [1, 2, 17, 64, 300])
def test_decode_step_matches_onnxruntime(decode, length):
    model, _, result = decode
    feeds = _feeds(length, seed=length)
    ours, ref = run_vm(result.executable, list(feeds.values())), ort_run(model, feeds)
    assert [o.shape for o in ours] == [r.shape for r in ref]
    assert ref[1].shape[2] == length + 1
    assert_close(ours, ref, rtol=0, atol=1e-3)        # max|ours - ort| <= 1e-3 * max|ort|, per output


def test_contradicting_cache_lengths_are_refused_naming_the_input(decode):
    """past_k of length 10 and past_v of 12 cannot both be ``past``: one line naming past_v, no answer."""
    _, _, result = decode
    feeds = _feeds(10, v_length=12)
    with pytest.raises(Exception) as err:
        run_vm(result.executable, list(feeds.values()))
    text = str(err.value).strip()
    assert "\n" not in text and "past_v" in text and "12" in text and "10" in text, text


def test_report_names_the_symbolic_size_and_the_kernels_that_depend_on_it(decode):
    _, _, result = decode
    report = result.report.to_dict()
    assert report["symbolic_sizes"] == ["past"]
    rows = report["kernels"]
    depending = [k for k in rows if k.get("symbolic") == ["past"]]
    # the kernels reading the cache (the cache concat, the flash-decoding attention) depend on past; the
    # projections do not
    ops = lambda k: "+".join(k["ops"])      # noqa: E731 - op names carry numbers (matmul3)
    assert any(ops(k).startswith("concat") for k in depending)
    assert any(k.get("rule") == "flash-decode" for k in depending), depending
    # the output projection: a one-row GEMV over the hidden size, whatever the cache length
    assert any(k.get("rule") == "gemv" and "symbolic" not in k for k in rows), rows
    assert all(set(k.get("symbolic", ["past"])) == {"past"} for k in rows)
    assert "symbolic size 'past': one build for every value" in summary_text(report)


def test_static_cache_imports_the_same_and_matches():
    model = decode_step(hidden=HIDDEN, kv_heads=KV_HEADS, head_dim=HEAD_DIM, past=None)
    mod = import_onnx(model)
    assert _tir_var_names(mod["main"]) == set()
    feeds = _feeds(5)
    result = compile_ours(mod)
    assert_close(run_vm(result.executable, list(feeds.values())), ort_run(model, feeds), rtol=0, atol=1e-3)
    assert "symbolic_sizes" not in result.report.to_dict()
    assert not any("symbolic" in k for k in result.report.kernels)


def _expand_like(length="n"):
    """``x.expand(2, *x.shape[1:])`` written with the exporter's guard for -1 sizes: the target from Shape
    (``Concat([2], Slice(Shape(x), 1, 3))``), ``Where(Equal(target, -1), 1, target)``, Expand; then
    ``y.view(2 * n, 4)`` from the same shape (Gather, Mul, Unsqueeze, Concat, Reshape)."""
    nodes = [
        _c("two_v", [2]), _c("ones", [1, 1, 1]), _c("one", 1), _c("one_v", [1]), _c("three_v", [3]),
        _c("four_v", [4]), _c("two", 2), _c("zero_v", [0]), _c("minus1", -1),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "one_v", "three_v"], ["rest"]),
        helper.make_node("Concat", ["two_v", "rest"], ["target0"], axis=0),
        helper.make_node("Equal", ["target0", "minus1"], ["is_keep"]),      # n == -1: false, as n >= 0
        helper.make_node("Where", ["is_keep", "ones", "target0"], ["target"]),
        helper.make_node("Expand", ["x", "target"], ["y"]),
        helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
        helper.make_node("Mul", ["n", "two"], ["n2"]),
        helper.make_node("Unsqueeze", ["n2", "zero_v"], ["n2_v"]),
        helper.make_node("Concat", ["n2_v", "four_v"], ["view"], axis=0),
        helper.make_node("Reshape", ["y", "view"], ["z"]),
    ]
    graph = helper.make_graph(nodes, "expand_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                  [1, length, 4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def test_size_comparisons_and_where_are_evaluated():
    model = _expand_like()
    mod = import_onnx(model)
    main = mod["main"]
    n = main.params[0].ty.shape.values[1]
    assert str(main.ret_ty.shape.values[0]) == str(n * 2) and _tir_var_names(main) == {"n"}
    result = compile_ours(mod)
    for length in (1, 3, 16):
        x = np.random.default_rng(length).standard_normal((1, length, 4)).astype("float32")
        assert_close(run_vm(result.executable, [x]), ort_run(model, {"x": x})[0], rtol=0, atol=1e-6)
