"""ConcatIdentityFusionPass: a one-input concat is its input."""

from onnx import helper
from tvm import relax

from tests.graph_fusion.common import assert_same_after, assert_switched_off, onnx_model, ops, run_ort, run_pass
from tests.helpers import assert_close, tol
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import ConcatIdentityFusionPass as P


def one_part_onnx():
    """DenseNet's first layer: Concat([x]) -> Relu, and a real two-part concat left alone."""
    nodes = [helper.make_node("Concat", ["x"], ["c1"], axis=1),
             helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("Concat", ["x", "r"], ["y"], axis=1)]
    return onnx_model(nodes, {"x": (1, 3, 4, 4)}, {"y": (1, 6, 4, 4)}, {})


def output_concat_module():
    """The one-part concat is the function's output (an output var keeps its binding)."""
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(relax.op.nn.relu(x))
            out = bb.emit_output(relax.op.concat([r], axis=0))
        bb.emit_func_output(out)
    return bb.get()


def test_one_part_concat_removed():
    model = one_part_onnx()
    mod = import_onnx(model)
    assert ops(mod).count("concat") == 2
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["nn.relu", "concat"]
    got, inputs = assert_same_after(mod, out)
    assert_close(got, run_ort(model, inputs), **tol("float32"))


def test_output_concat():
    mod = output_concat_module()
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1
    assert_same_after(mod, out)


def test_switched_off():
    assert_switched_off(P, import_onnx(one_part_onnx()), 1)
