"""GemvRule: one to a few rows times a weight (a decode step) - numbers equal to the unscheduled kernel, the
weight in panels with the panel loop parallel, the norm before or after computed once; what is not a GEMV is
declined."""

from __future__ import annotations

import numpy as np
import pytest
import tvm_ffi
from tvm import relax, tirx
from tvm.relax import op

from tests.helpers import assert_same_numbers
from tests.schedule.kernels import HOST, NATIVE, check_rule, fused_kernel
from tvm_ascendfuse.rule_specs import GroupShape, predict_rule
from tvm_ascendfuse.schedule.gemv import GemvRule, panel_columns
from tvm_ascendfuse.schedule.hostvec import HostVector
from tvm_ascendfuse.target import get_target

NPU = get_target("ascend910b")


def swiglu(x, wg, wu):
    return op.multiply(op.nn.silu(op.matmul(x, wg)), op.matmul(x, wu))


def residual_then_norm(x, w, r, g):
    """LLaMA's down projection: + residual (returned: the next block's residual stream) -> next RMSNorm."""
    h = op.add(op.matmul(x, w), r)
    return relax.Tuple([h, op.nn.rms_norm(h, g, axes=[-1])])


def norm_then_projection(x, g, w):
    return op.matmul(op.nn.rms_norm(x, g, axes=[-1]), w)


def bias_residual(x, w, b, r):
    return op.add(op.add(op.matmul(x, w), b), r)


@pytest.mark.parametrize("host", [HOST, NATIVE], ids=["portable", "native"])
@pytest.mark.parametrize("build,shapes", [
    (swiglu, [(1, 1, 64), (64, 96), (64, 96)]),
    (residual_then_norm, [(1, 1, 96), (96, 128), (1, 1, 128), (128,)]),
    (norm_then_projection, [(1, 1, 64), (64,), (64, 192)]),
    (bias_residual, [(3, 40), (40, 64), (64,), (3, 64)]),          # three rows
    (bias_residual, [(2, 2, 40), (40, 48), (48,), (2, 2, 48)]),    # batch 2 x 2 rows
    (lambda x, w: op.matmul(x, w), [(1, 130), (130, 32)]),           # no epilogue: the accumulator copied out
    (bias_residual, [(1, 72), (72, 1000), (1000,), (1, 1000)]),      # 1000 classes: panels of 40 columns
    (bias_residual, [(1, 24), (24, 10), (10,), (1, 10)]),            # 10 classes: panels of 2 columns
], ids=["swiglu", "residual_norm", "norm_projection", "three_rows", "batch_rows", "plain", "classes", "ten"])
def test_numbers(build, shapes, host):
    func = fused_kernel(build, shapes).with_attr("layout_free_buffers", [1])
    mod = check_rule(GemvRule(), func, host=host)
    assert "gemv panels of" in mod.script()


def test_weight_in_panels_and_the_panel_loop_parallel():
    func = fused_kernel(swiglu, [(1, 1, 256), (256, 512), (256, 512)]).with_attr("layout_free_buffers", [1, 2])
    sch = GemvRule().apply(func, NPU, NATIVE)
    script = sch.mod.script()
    assert script.count("layout_rewrite_preproc") == 2               # both weights laid out once
    loops = []
    tvm_ffi.structural_walk(sch.mod["main"].body, (tirx.For, loops.append))
    parallel = [lp for lp in loops if lp.kind == tirx.ForKind.PARALLEL]
    assert len(parallel) == 1 and int(parallel[0].extent) * panel_columns(512, 1, HostVector(512, 32, 2),
                                                                            "float32") == 512


def test_norm_computed_once_not_per_panel():
    """The RMSNorm of the row is a stage in front of the panel loop: its rsqrt appears once, outside it."""
    sch = GemvRule().apply(fused_kernel(norm_then_projection, [(1, 1, 64), (64,), (64, 192)]), NPU, NATIVE)
    body = sch.mod["main"].script()
    par = body.index("T.parallel")
    assert "T.rsqrt" in body[:par] and "T.rsqrt" not in body[par:]


@pytest.mark.parametrize("build,shapes,why", [
    (bias_residual, [(5, 40), (40, 64), (64,), (5, 64)], "five rows: the matmul rule's register blocks"),
    (lambda x, w1, w2: op.matmul(op.nn.relu(op.matmul(x, w1)), w2), [(1, 32), (32, 64), (64, 32)], "chained"),
    (lambda q, k, v: op.matmul(op.nn.softmax(op.matmul(q, op.permute_dims(k)), -1), v),
     [(1, 16), (32, 16), (32, 16)], "attention: a softmax between the products"),
])
def test_declines(build, shapes, why):
    assert GemvRule().apply(fused_kernel(build, shapes), NPU, NATIVE) is None, why


def test_symbolic_rows_declined():
    n = tirx.Var("n", "int64")
    assert GemvRule().apply(fused_kernel(bias_residual, [(n, 40), (40, 64), (64,), (n, 64)]), NPU, NATIVE) is None


def test_panel_columns():
    hv = HostVector(512, 32, 2)
    assert panel_columns(2816, 1, hv, "float32") == 128         # eight vectors, 22 panels
    assert panel_columns(256, 1, hv, "float32") == 32            # fewer columns: enough panels for the cores
    assert panel_columns(48, 1, hv, "float32") == 16
    assert panel_columns(1000, 1, hv, "float32") == 40          # 16 + 16 + 8 lanes, 25 panels
    assert panel_columns(10, 1, hv, "float32") == 2              # five panels of two columns
    assert panel_columns(18, 1, hv, "float32") == 2              # nine panels of two columns
    assert panel_columns(1024, 4, HostVector(256, 16, 2), "float32") == 16    # 4 rows x 2 vectors = 8 acc.


def test_rule_table_sends_few_rows_to_gemv():
    assert predict_rule(GroupShape("GEeRE", rows=1)).name == "gemv"
    assert predict_rule(GroupShape("GEGE", rows=1)).name == "gemv"
    assert predict_rule(GroupShape("RGE", rows=4)).name == "gemv"
    assert predict_rule(GroupShape("GEeRE", rows=5)).name == "matmul+norm"
    assert predict_rule(GroupShape("GEeRE", rows=None)).name == "matmul+norm"     # symbolic rows
    assert predict_rule(GroupShape("GEeRE", rows=1, batched=True)).name == "matmul+norm"   # no shared weight
    assert predict_rule(GroupShape("GERG", True, rows=1, batched=True)).name == "decode-attention"


def _decoder_step(h=128, ffn=256):
    """One LLaMA-style decoder MLP half at one token: RMSNorm -> SwiGLU -> down projection + residual -> the
    next block's RMSNorm; weights constant."""
    rng = np.random.default_rng(0)
    c = lambda *s: relax.const((rng.standard_normal(s) / np.sqrt(s[0])).astype("float32"))  # noqa: E731
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 1, h), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            n = bb.emit(op.nn.rms_norm(x, c(h), axes=[-1]))
            a = bb.emit(op.multiply(op.nn.silu(op.matmul(n, c(h, ffn))), op.matmul(n, c(h, ffn))))
            r = bb.emit(op.add(op.matmul(a, c(ffn, h)), x))
            out = bb.emit_output(relax.Tuple([r, op.nn.rms_norm(r, c(h), axes=[-1])]))
        bb.emit_func_output(out)
    return bb.get()


def test_decoder_step_end_to_end_on_gemv_kernels():
    result = assert_same_numbers(_decoder_step())
    rules = {k["rule"] for k in result.report.kernels if any("matmul" in o for o in k["ops"])}
    assert rules == {"gemv"}, [(k["rule"], k["ops"]) for k in result.report.kernels]
