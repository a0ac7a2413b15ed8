"""MatMulSiblingMergeFusionPass: matmuls of one input with constant weights -> one matmul + slices."""

import numpy as np
import pytest
from tvm import relax

from tests.graph_fusion.common import assert_same_after, assert_switched_off, build, ops, run_pass
from tests.helpers import assert_same_numbers, kernel_count
from tvm_ascendfuse.graph_fusion import MatMulSiblingMergeFusionPass as Merge

RNG = np.random.default_rng(11)
X = (2, 6, 16)


def const(shape, dtype="float32"):
    return relax.const(RNG.standard_normal(shape).astype(dtype))


def siblings(ns, biases, relu=True):
    """``x`` times one (16, n) constant weight per sibling, a bias add where ``biases`` says so, each result
    through its own ReLU (so the siblings are consumed separately, as Q/K/V are)."""
    def body(bb, x):
        outs = []
        for n, with_bias in zip(ns, biases):
            y = bb.emit(relax.op.matmul(x, const((16, n))))
            if with_bias:
                y = bb.emit(relax.op.add(y, const((n,))))
            outs.append(bb.emit(relax.op.nn.relu(y)) if relu else y)
        return outs
    return body


def merged_weight(out, matmuls=1):
    """Shape of the (last) matmul's weight; ``matmuls`` is how many matmuls the function must have."""
    mm = [b.value for b in out["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call) and b.value.op.name == "relax.matmul"]
    assert len(mm) == matmuls
    shapes = [tuple(int(d) for d in m.args[1].value.shape) if hasattr(m.args[1], "value") else None for m in mm]
    return shapes[-1] if matmuls == 1 else shapes


@pytest.mark.parametrize("ns,biases", [((8, 8), (False, False)), ((8, 12, 4), (True, True, True)),
                                       ((8, 12, 4), (True, False, True))])
def test_siblings_merged(ns, biases):
    mod = build(siblings(ns, biases), X)
    out, rec = run_pass(Merge, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    expect = ["matmul"] + (["add"] if any(biases) else []) + ["strided_slice", "nn.relu"] * len(ns)
    assert ops(out) == expect
    assert merged_weight(out) == (16, sum(ns))
    assert_same_after(mod, out)


def test_outputs_returned_directly():
    """Siblings that are function outputs themselves keep their variables (now slices)."""
    mod = build(siblings((8, 4), (True, False), relu=False), X)
    out, rec = run_pass(Merge, mod)
    assert rec.effect_times == 1 and ops(out) == ["matmul", "add", "strided_slice", "strided_slice"]
    assert_same_after(mod, out)


def test_non_constant_weight_untouched():
    def body(bb, x, w):
        return [bb.emit(relax.op.matmul(x, w)), bb.emit(relax.op.matmul(x, const((16, 8))))]
    mod = build(body, X, (16, 8))
    out, rec = run_pass(Merge, mod)
    assert rec.match_times == 0 and out.same_as(mod)


def test_constant_siblings_merged_beside_a_runtime_weight():
    def body(bb, x, w):
        return [bb.emit(relax.op.matmul(x, w)), bb.emit(relax.op.matmul(x, const((16, 8)))),
                bb.emit(relax.op.matmul(x, const((16, 4))))]
    mod = build(body, X, (16, 8))
    out, rec = run_pass(Merge, mod)
    assert rec.effect_times == 1 and merged_weight(out, 2)[1] == (16, 12)
    assert ops(out) == ["matmul", "matmul", "strided_slice", "strided_slice"]
    assert_same_after(mod, out)


def test_switched_off_untouched_but_counted():
    assert_switched_off(Merge, build(siblings((8, 12, 4), (True, True, True)), X), 1)


def test_swiglu_siblings_refused():
    """silu(x·Wg) * (x·Wu): the multi-GEMM kernel already reads x once; merging would only split it."""
    def body(bb, x):
        g = bb.emit(relax.op.nn.silu(bb.emit(relax.op.matmul(x, const((16, 8))))))
        return relax.op.multiply(g, bb.emit(relax.op.matmul(x, const((16, 8)))))
    mod = build(body, X)
    out, rec = run_pass(Merge, mod)
    assert (rec.match_times, rec.effect_times) == (1, 0)
    assert rec.not_effective[0]["reason"] == "check_failed"
    assert "combined elementwise" in rec.not_effective[0]["failed"]
    assert out.same_as(mod)


def test_different_input_not_siblings():
    def body(bb, x, z):
        return [bb.emit(relax.op.matmul(x, const((16, 8)))), bb.emit(relax.op.matmul(z, const((16, 8))))]
    mod = build(body, X, X)
    out, rec = run_pass(Merge, mod)
    assert rec.match_times == 0 and out.same_as(mod)


def test_fp16_siblings():
    def body(bb, x):
        return [bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, const((16, n), "float16"))), const((n,), "float16")))
                for n in (8, 16)]
    mod = build(body, X, dtype="float16")
    out, rec = run_pass(Merge, mod)
    assert rec.effect_times == 1
    assert_same_after(mod, out)


# ---- whole pipeline -------------------------------------------------------------------------------------
OFF = {"MatMulSiblingMergeFusionPass": "off"}


def test_pipeline_three_siblings_one_kernel():
    """Through the whole pipeline: same numbers, fewer kernels, and the input read once."""
    mod = build(siblings((8, 12, 4), (True, True, True)), X)
    on, off = assert_same_numbers(mod), assert_same_numbers(mod, switches=OFF)
    assert kernel_count(on) < kernel_count(off)
    assert on.report.get(Merge.switch_name).effect_times == 1
    assert off.report.get(Merge.switch_name).not_effective[0]["reason"] == "switched_off"
    assert on.report.sections["traffic"]["ours"]["gm_bytes"] < off.report.sections["traffic"]["ours"]["gm_bytes"]
