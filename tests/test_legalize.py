"""legalize.legalize_ops: TVM's LegalizeOps with our gather; the same numbers, none of TOPI's warnings."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax import op

from tests.helpers import compile_ours, run_vm
from tvm_ascendfuse.legalize import legalize_ops


def _gather_module(data_shape, idx_shape, axis, mode="fast", idx_dtype="int64"):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(data_shape, "float32"))
    ids = relax.Var("ids", relax.TensorType(idx_shape, idx_dtype))
    with bb.function("main", [x, ids]):
        with bb.dataflow():
            g = bb.emit(op.take(x, ids, axis=axis, mode=mode))
            out = bb.emit_output(op.multiply(g, relax.const(2.0, "float32")))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("data_shape,idx_shape,axis,idx_dtype", [
    ((10, 4), (2, 5), 0, "int64"),          # an embedding lookup
    ((3, 7, 4), (6,), 1, "int32"),
    ((3, 7, 4), (2, 2), -1, "int64"),
    ((5, 6), (), 0, "int64"),               # one row (a scalar index)
])
def test_gather_numbers_and_no_warning(data_shape, idx_shape, axis, idx_dtype, capfd):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(data_shape).astype("float32")
    ids = rng.integers(0, data_shape[axis], idx_shape).astype(idx_dtype)
    result = compile_ours(_gather_module(data_shape, idx_shape, axis, idx_dtype=idx_dtype), traffic_baseline=True)
    np.testing.assert_array_equal(run_vm(result.executable, [x, ids]), np.take(x, ids, axis=axis) * 2)
    printed = capfd.readouterr()
    assert "segfaults" not in printed.err + printed.out


def test_other_modes_stay_topis():
    """``clip`` is TOPI's lowering (out-of-range indices clamped), as TVM builds it."""
    mod = legalize_ops()(_gather_module((4, 3), (5,), 0, mode="clip"))
    ex = tvm.compile(mod, target="llvm")
    x = np.arange(12, dtype="float32").reshape(4, 3)
    ids = np.array([0, 3, 7, -2, 1], dtype="int64")
    np.testing.assert_array_equal(run_vm(ex, [x, ids]), np.take(x, ids, axis=0, mode="clip") * 2)
