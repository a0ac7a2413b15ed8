"""Weight packing evaluated with numpy (``FoldConstantCopies``) must give exactly what TVM's build gives.

Each copy PrimFunc is run both ways: built with LLVM (output pre-filled with zeros, so elements it never
writes compare as zeros too) and evaluated by ``eval_copy_primfunc``; the arrays must be bit-identical.
PrimFuncs that compute on values, or write an element twice, are declined (FoldConstant folds them).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.relax import op
from tvm.script import tirx as T

from tests.helpers import assert_close, assert_same_numbers, tol
from tests.schedule.kernels import NATIVE, schedule_gemms
from tvm_ascendfuse.schedule.prepack import NotACopy, eval_copy_outputs, eval_copy_primfunc, fold_constant_copies


@T.prim_func(private=True, s_tir=True)
def gemm_pack_padded(w: T.Buffer((T.int64(24), T.int64(48)), "float32"),
                     o: T.Buffer((T.int64(2), T.int64(24), T.int64(32)), "float32")):
    for a0, a1 in T.grid(T.int64(24), T.int64(48)):
        with T.sblock("pack"):
            v0, v1 = T.axis.remap("SS", [a0, a1])
            o[v1 // T.int64(32), v0, v1 % T.int64(32)] = w[v0, v1]


@T.prim_func(private=True, s_tir=True)
def conv_pack(w: T.Buffer((T.int64(40), T.int64(3), T.int64(3), T.int64(3)), "float32"),
              o: T.Buffer((T.int64(3), T.int64(3), T.int64(3), T.int64(3), T.int64(16)), "float32")):
    for a0, a1, a2, a3 in T.grid(T.int64(40), T.int64(3), T.int64(3), T.int64(3)):
        with T.sblock("pack"):
            v0, v1, v2, v3 = T.axis.remap("SSSS", [a0, a1, a2, a3])
            o[v0 // T.int64(16), v1, v2, v3, v0 % T.int64(16)] = w[v0, v1, v2, v3]


@T.prim_func(private=True, s_tir=True)
def select_padded_transpose(w: T.Buffer((T.int64(20), T.int64(6)), "float16"),
                            o: T.Buffer((T.int64(2), T.int64(6), T.int64(16)), "float16")):
    # loops over the packed domain; the padding branch would read out of bounds if it were taken
    for a0, a1, a2 in T.grid(T.int64(2), T.int64(6), T.int64(16)):
        with T.sblock("pack"):
            v0, v1, v2 = T.axis.remap("SSS", [a0, a1, a2])
            o[v0, v1, v2] = T.if_then_else(v0 * T.int64(16) + v2 < T.int64(20), w[v0 * T.int64(16) + v2, v1],
                                           T.float16(0))


@T.prim_func(private=True, s_tir=True)
def predicated_int8(w: T.Buffer((T.int64(10),), "int8"), o: T.Buffer((T.int64(12),), "int8")):
    for a0 in range(T.int64(12)):
        with T.sblock("pack"):
            v0 = T.axis.spatial(T.int64(12), a0)
            T.where(a0 < T.int64(10))
            o[T.int64(11) - v0] = w[v0]


@T.prim_func(private=True, s_tir=True)
def scales_values(w: T.Buffer((T.int64(8),), "float32"), o: T.Buffer((T.int64(8),), "float32")):
    for a0 in range(T.int64(8)):
        with T.sblock("pack"):
            v0 = T.axis.spatial(T.int64(8), a0)
            o[v0] = w[v0] * T.float32(2)


@T.prim_func(private=True, s_tir=True)
def writes_twice(w: T.Buffer((T.int64(8),), "float32"), o: T.Buffer((T.int64(4),), "float32")):
    for a0 in range(T.int64(8)):
        with T.sblock("pack"):
            v0 = T.axis.spatial(T.int64(8), a0)
            o[v0 // T.int64(2)] = w[v0]


@T.prim_func(private=True, s_tir=True)
def int_value_arithmetic(w: T.Buffer((T.int64(8),), "int32"), o: T.Buffer((T.int64(8),), "int32")):
    for a0 in range(T.int64(8)):
        with T.sblock("pack"):
            v0 = T.axis.spatial(T.int64(8), a0)
            o[v0] = w[v0] + 1


@T.prim_func(private=True, s_tir=True)
def two_weights(a: T.Buffer((T.int64(8), T.int64(64)), "float32"), b: T.Buffer((T.int64(64), T.int64(8)), "float32"),
                oa: T.Buffer((T.int64(2), T.int64(8), T.int64(32)), "float32"),
                ob: T.Buffer((T.int64(1), T.int64(64), T.int64(8)), "float32")):
    # several weights of one kernel (a two-GEMM chain) packed by one PrimFunc: one nest per output
    for a0, a1 in T.grid(T.int64(8), T.int64(64)):
        with T.sblock("pa"):
            v0, v1 = T.axis.remap("SS", [a0, a1])
            oa[v1 // T.int64(32), v0, v1 % T.int64(32)] = a[v0, v1]
    for a0, a1 in T.grid(T.int64(64), T.int64(8)):
        with T.sblock("pb"):
            v0, v1 = T.axis.remap("SS", [a0, a1])
            ob[v1 // T.int64(32), v0, v1 % T.int64(32)] = b[v0, v1]


def test_one_packing_function_for_several_weights():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((8, 64)).astype("float32"), rng.standard_normal((64, 8)).astype("float32")
    oa, ob = eval_copy_outputs(two_weights, [a, b])
    lib = tvm.compile(tvm.IRModule({"main": two_weights.with_attr("global_symbol", "main")}), target="llvm")
    ra, rb = tvm.runtime.tensor(np.zeros((2, 8, 32), "float32")), tvm.runtime.tensor(np.zeros((1, 64, 8), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), ra, rb)
    assert np.array_equal(oa, ra.numpy()) and np.array_equal(ob, rb.numpy())
    with pytest.raises(NotACopy):
        eval_copy_primfunc(two_weights, [a, b])


def _run_tvm(func, x):
    out_t = func.params[-1].ty
    out = np.zeros([int(d) for d in out_t.shape], dtype=str(out_t.dtype))
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")
    res = tvm.runtime.tensor(out)
    lib["main"](tvm.runtime.tensor(x), res)
    return res.numpy()


@pytest.mark.parametrize("func", [gemm_pack_padded, conv_pack, select_padded_transpose, predicated_int8],
                         ids=["gemm_padded", "conv", "select_transpose_fp16", "predicated_int8"])
def test_numpy_packing_is_bit_identical_to_tvm(func):
    t = func.params[0].ty
    shape, dtype = [int(d) for d in t.shape], str(t.dtype)
    rng = np.random.default_rng(0)
    x = (rng.integers(-100, 100, shape) if dtype == "int8" else rng.standard_normal(shape)).astype(dtype)
    ours = eval_copy_primfunc(func, [x])
    ref = _run_tvm(func, x)
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    assert np.array_equal(ours, ref)


@pytest.mark.parametrize("func", [scales_values, writes_twice, int_value_arithmetic])
def test_non_copies_are_declined(func):
    t = func.params[0].ty
    with pytest.raises(NotACopy):
        eval_copy_primfunc(func, [np.ones([int(d) for d in t.shape], dtype=str(t.dtype))])


def _constants(mod):
    found = []
    relax.analysis.post_order_visit(mod["main"].body, lambda e: found.append(e.value.numpy())
                                    if isinstance(e, tvm.ir.GenericConst) else None)
    return found


def test_folding_packs_like_fold_constant_on_a_scheduled_gemm():
    rng = np.random.default_rng(3)
    w, b = rng.standard_normal((24, 64)).astype("float32"), rng.standard_normal(64).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 24), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.nn.relu(op.add(op.matmul(x, relax.const(w)), relax.const(b))))
        bb.emit_func_output(out)
    passes = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
              relax.transform.FuseTIR(), relax.transform.AttachAttrLayoutFreeBuffers(), schedule_gemms,
              relax.transform.SplitLayoutRewritePreproc()]
    split = tvm.transform.Sequential(passes)(bb.get())
    assert any(gv.name_hint.endswith("_weight_prepack") for gv in split.functions)
    ours = relax.transform.DeadCodeElimination()(fold_constant_copies(split))
    assert not any(gv.name_hint.endswith("_weight_prepack") for gv in ours.functions)
    ref = relax.transform.DeadCodeElimination()(relax.transform.FoldConstant()(split))
    a, r = _constants(ours), _constants(ref)
    assert len(a) == len(r) >= 2 and any(c.ndim == 3 for c in a)      # the packed (N/nr, K, nr) weight
    for c_ours, c_ref in zip(sorted(a, key=lambda c: c.shape), sorted(r, key=lambda c: c.shape)):
        assert np.array_equal(c_ours, c_ref)
    xv = rng.standard_normal((8, 24)).astype("float32")
    res = relax.VirtualMachine(tvm.compile(ours, target=NATIVE), tvm.cpu())["main"](tvm.runtime.tensor(xv))
    assert_close(res.numpy(), np.maximum(xv @ w + b, 0), **tol("float32"))


def test_pipeline_conv_weights_packed_without_a_packing_kernel():
    from tvm_ascendfuse.frontend import import_onnx
    from tvm_ascendfuse.workloads import conv_bn_relu

    result = assert_same_numbers(import_onnx(conv_bn_relu(in_channels=8, out_channels=40, hw=10)))
    names = [gv.name_hint for gv, f in result.scheduled_module.functions.items() if isinstance(f, tirx.PrimFunc)]
    assert any(n.endswith("_prepacked") for n in names)
    assert not any(n.endswith("_weight_prepack") for n in names)
