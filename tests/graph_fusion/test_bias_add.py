"""ConvBiasAddFusionPass and MatMulBiasAddFusionPass: canonical op + one constant bias."""

import numpy as np
from onnx import helper
from tvm import relax

from tests.graph_fusion.common import assert_same_after, assert_switched_off, build, onnx_model, ops, run_pass
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import ConvBiasAddFusionPass, MatMulBiasAddFusionPass

RNG = np.random.default_rng(2)
CONV_IN = (1, 3, 6, 6)


def const(shape, dtype="float32"):
    return relax.const(RNG.standard_normal(shape).astype(dtype))


def conv_chain(bb, x, dtype="float32"):
    c = bb.emit(relax.op.nn.conv2d(x, const((4, 3, 3, 3), dtype), padding=1))
    b1 = bb.emit(relax.op.reshape(const((4,), dtype), (1, 4, 1, 1)))
    a1 = bb.emit(relax.op.add(b1, c))                                   # swapped operands, reshaped bias
    a2 = bb.emit(relax.op.subtract(a1, const((1, 4, 1, 1), dtype)))    # subtract a per-channel constant
    a3 = bb.emit(relax.op.add(a2, relax.const(0.25, dtype)))            # scalar
    return relax.op.nn.relu(a3)


def test_conv_bias_chain_merged():
    mod = build(conv_chain, CONV_IN)
    out, rec = run_pass(ConvBiasAddFusionPass, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["nn.conv2d", "add", "nn.relu"]
    add = out["main"].body.blocks[0].bindings[1].value
    assert add.args[0].same_as(out["main"].body.blocks[0].bindings[0].var)       # conv first
    assert tuple(add.args[1].value.shape) == (1, 4, 1, 1)                       # one (1,C,1,1) constant
    assert_same_after(mod, out)
    again, rec2 = run_pass(ConvBiasAddFusionPass, out)                          # canonical: not a match
    assert rec2.match_times == 0 and again.same_as(out)


def test_conv_bias_fp16():
    mod = build(lambda bb, x: conv_chain(bb, x, "float16"), CONV_IN, dtype="float16")
    out, rec = run_pass(ConvBiasAddFusionPass, mod)
    assert rec.effect_times == 1 and ops(out) == ["nn.conv2d", "add", "nn.relu"]
    assert_same_after(mod, out)


def test_conv_bias_onnx_reshape_folded():
    model = onnx_model([helper.make_node("Conv", ["x", "W", "B"], ["y"])], {"x": (1, 3, 5, 5)}, {"y": (1, 4, 3, 3)},
                       {"W": RNG.standard_normal((4, 3, 3, 3)).astype("float32"),
                        "B": RNG.standard_normal(4).astype("float32")})
    mod = import_onnx(model)
    assert ops(mod) == ["nn.conv2d", "reshape", "add"]
    out, rec = run_pass(ConvBiasAddFusionPass, mod)
    assert rec.effect_times == 1 and ops(out) == ["nn.conv2d", "add"]
    assert_same_after(mod, out)


def test_conv_not_per_channel_left_alone():
    mod = build(lambda bb, x: relax.op.add(bb.emit(relax.op.nn.conv2d(x, const((4, 3, 3, 3)), padding=1)),
                                           const((1, 4, 6, 6))), CONV_IN)
    out, rec = run_pass(ConvBiasAddFusionPass, mod)
    assert rec.match_times == 0 and out.same_as(mod)


def test_conv_bias_switched_off():
    assert_switched_off(ConvBiasAddFusionPass, build(conv_chain, CONV_IN), 1)


def test_gemm_import_canonical():
    """ONNX Gemm(transB=1) = permute_dims(W) + matmul + add: the transpose becomes a constant."""
    model = onnx_model([helper.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1)], {"x": (3, 8)}, {"y": (3, 5)},
                       {"W": RNG.standard_normal((5, 8)).astype("float32"),
                        "B": RNG.standard_normal(5).astype("float32")})
    mod = import_onnx(model)
    assert ops(mod) == ["permute_dims", "matmul", "add"]
    out, rec = run_pass(MatMulBiasAddFusionPass, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["matmul", "add"]
    mm = out["main"].body.blocks[0].bindings[0].value
    assert tuple(mm.args[1].value.shape) == (8, 5)
    assert_same_after(mod, out)


def matmul_chain(bb, x):
    w = bb.emit(relax.op.permute_dims(const((5, 8)), [1, 0]))
    mm = bb.emit(relax.op.matmul(x, w))
    a1 = bb.emit(relax.op.add(const((1, 5)), mm))
    return relax.op.add(a1, const((5,)))


def test_matmul_bias_chain():
    mod = build(matmul_chain, (3, 8))
    out, rec = run_pass(MatMulBiasAddFusionPass, mod)
    assert (rec.match_times, rec.effect_times) == (2, 2)        # the weight fold and the bias merge
    assert ops(out) == ["matmul", "add"]
    add = out["main"].body.blocks[0].bindings[1].value
    assert tuple(add.args[1].value.shape) == (5,)
    assert_same_after(mod, out)


def test_matmul_switched_off():
    mod = build(matmul_chain, (3, 8))
    assert_switched_off(MatMulBiasAddFusionPass, mod, 2)
    _, rec = run_pass(MatMulBiasAddFusionPass, mod, enabled=False)
    assert sorted(e["kind"] for e in rec.not_effective) == ["fold_weight", "merge_bias"]


def test_matmul_non_constant_weight_left_alone():
    w = relax.Var("w", relax.TensorType((8, 5), "float32"))
    x = relax.Var("x", relax.TensorType((3, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            mm = bb.emit(relax.op.matmul(x, w))
            out = bb.emit_output(relax.op.add(mm, const((5,))))
        bb.emit_func_output(out)
    mod = bb.get()
    out, rec = run_pass(MatMulBiasAddFusionPass, mod)
    assert rec.match_times == 0 and out.same_as(mod)
