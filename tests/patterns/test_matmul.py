"""matmul epilogue patterns (TbeMatmulElemwiseFusionPass)."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tests.helpers import assert_close, assert_same_numbers, compile_ours, tol
from tests.patterns.util import assert_fused, assert_one_kernel, build, const, refusals, run_symbolic

X = ("x", (8, 16), "float32")
W = ("w", (16, 32), "float32")
RES = ("r", (8, 32), "float32")


def mm(bb, x, w):
    return bb.emit(relax.op.matmul(x, w))


def bias(bb, y, dtype="float32"):
    return bb.emit(relax.op.add(y, const((32,), dtype)))


ACTS = {
    "relu": relax.op.nn.relu, "gelu": relax.op.nn.gelu, "gelu_tanh": relax.op.nn.gelu_tanh,
    "silu": relax.op.nn.silu, "sigmoid": relax.op.sigmoid,
}


@pytest.mark.parametrize("act", sorted(ACTS))
def test_matmul_bias_activation(act):
    assert_fused(build([X, W], lambda bb, x, w: ACTS[act](bias(bb, mm(bb, x, w)))), "ascendfuse.matmul.bias_act")


def test_matmul_bias():
    assert_fused(build([X, W], lambda bb, x, w: bias(bb, mm(bb, x, w))), "ascendfuse.matmul.bias")


def test_matmul_act():
    assert_fused(build([X, W], lambda bb, x, w: relax.op.nn.relu(mm(bb, x, w))), "ascendfuse.matmul.act")


def test_matmul_bias_act_residual():
    mod = build([X, W, RES], lambda bb, x, w, r: relax.op.add(
        bb.emit(relax.op.nn.gelu(bias(bb, mm(bb, x, w)))), r))
    assert_fused(mod, "ascendfuse.matmul.bias_act_residual")


def test_matmul_bias_residual_act():
    mod = build([X, W, RES], lambda bb, x, w, r: relax.op.nn.relu(
        bb.emit(relax.op.add(bias(bb, mm(bb, x, w)), r))))
    assert_fused(mod, "ascendfuse.matmul.bias_residual_act")


def test_matmul_bias_residual():
    mod = build([X, W, RES], lambda bb, x, w, r: relax.op.add(bias(bb, mm(bb, x, w)), r))
    assert_fused(mod, "ascendfuse.matmul.bias_residual")


def test_batched_matmul_fp16():
    mod = build([("x", (2, 8, 16), "float16"), ("w", (16, 32), "float16")],
                lambda bb, x, w: relax.op.nn.silu(bias(bb, mm(bb, x, w), "float16")))
    assert_fused(mod, "ascendfuse.matmul.bias_act")


def test_int_matmul_is_refused():
    mod = build([("x", (8, 16), "int32"), ("w", (16, 32), "int32")],
                lambda bb, x, w: relax.op.nn.relu(mm(bb, x, w)))
    result = assert_same_numbers(mod)
    reasons = [r.get("failed", "") for r in refusals(result, "TbeMatmulElemwiseFusionPass")]
    assert any("int32" in r and "float" in r for r in reasons), reasons


def test_block_output_intermediate_is_refused():
    """The matmul result is also a function output: fusing would drop it."""
    bb = relax.BlockBuilder()
    x, w = (relax.Var(n, relax.TensorType(s, d)) for n, s, d in (X, W))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            m = bb.emit_output(relax.op.matmul(x, w))
            o = bb.emit_output(relax.op.nn.relu(m))
        bb.emit_func_output(relax.Tuple([m, o]))
    result = assert_same_numbers(bb.get())
    reasons = [r.get("failed", "") for r in refusals(result, "TbeMatmulElemwiseFusionPass")]
    assert any("output of the dataflow block" in r for r in reasons), reasons


def test_symbolic_batch_is_accepted():
    n = tvm.tirx.Var("n", "int64")
    mod = build([("x", (n, 16), "float32"), W], lambda bb, x, w: relax.op.nn.relu(bias(bb, mm(bb, x, w))))
    result = compile_ours(mod)
    assert_one_kernel(result, "ascendfuse.matmul.bias_act")
    for rows in (3, 17):
        run_symbolic(mod, result, [(rows, 16), (16, 32)])


def test_bfloat16_matmul_relu():
    """bfloat16 is a cube dtype: fused, and close to a float32 numpy reference at bf16 tolerance."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    mod = build([("x", (8, 16), "bfloat16"), ("w", (16, 32), "bfloat16")],
                lambda bb, x, w: relax.op.nn.relu(mm(bb, x, w)))
    result = compile_ours(mod)
    assert_one_kernel(result, "ascendfuse.matmul.act")
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(s).astype(ml_dtypes.bfloat16) for s in ((8, 16), (16, 32)))
    out = relax.VirtualMachine(result.executable, tvm.cpu())["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w))
    ref = np.maximum(x.astype("float32") @ w.astype("float32"), 0)
    assert_close(out.numpy().astype("float32"), ref, **tol("bfloat16"))
