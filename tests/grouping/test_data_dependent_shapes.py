"""Grouping with a length computed at run time (ONNX Range): ``n`` is read from a tensor and bound by a
match_cast, then ``arange(0, n)`` and its consumers have shape ``(n,)``.

Two things broke the build ("call_tir expects all TensorType has shape"): a sibling merge put the length's
computation and its users in one kernel (nothing tied them: the dependence goes through the symbolic dim, not
a tensor), and a group that took the arange in had no input defining ``n``. Both are refused now; the numbers
are checked against numpy and TVM's default pipeline at several lengths.
"""

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tests.helpers import assert_close, compile_ours, run_reference, run_vm


def _range_graph(consumers: str = "affine"):
    """start, limit, delta -> arange(ceil((limit - start) / delta)) * delta + start (+ a second output)."""
    bb = relax.BlockBuilder()
    start, limit, delta = (relax.Var(n, relax.TensorType((), "float32")) for n in ("start", "limit", "delta"))
    n = tirx.Var("n", "int64")
    with bb.function("main", [start, limit, delta]):
        with bb.dataflow():
            count = bb.emit(relax.op.ceil(relax.op.divide(relax.op.subtract(limit, start), delta)))
            count = bb.emit(relax.op.astype(relax.op.maximum(count, relax.const(0.0, "float32")), "int64"))
            shape = bb.emit(relax.op.tensor_to_shape(bb.emit(relax.op.reshape(count, [1]))))
            bb.match_cast(shape, relax.ShapeType([n]))
            steps = bb.emit(relax.op.arange(0, n, 1, dtype="float32"))
            out = relax.op.add(relax.op.multiply(steps, delta), start)
            if consumers == "two_outputs":
                # the arange read by two groups (a duplication candidate) and the length also returned
                out = relax.Tuple([bb.emit(out), bb.emit(relax.op.exp(relax.op.negative(steps))), count])
            res = bb.emit_output(out)
        bb.emit_func_output(res)
    return bb.get()


RANGES = [(1.0, 5.5, 0.5), (0.0, 3.0, 1.0), (10.0, 2.0, -3.0), (2.0, 2.0, 1.0)]


@pytest.mark.parametrize("consumers", ["affine", "two_outputs"])
def test_range_lengths_match_numpy_and_default(consumers):
    mod = _range_graph(consumers)
    result = compile_ours(mod)
    for values in RANGES:
        inputs = [np.array(v, "float32") for v in values]
        ours, ref = run_vm(result.executable, inputs), run_reference(mod, inputs)
        ours, ref = (ours, ref) if isinstance(ours, list) else ([ours], [ref])
        assert_close(ours[0], np.arange(*values, dtype="float32"), rtol=1e-6)
        for a, b in zip(ours, ref):
            assert_close(a, b, rtol=1e-6)


def test_length_and_its_users_stay_apart():
    """No kernel computes the length and uses it: the arange's kernel reads no tensor the length comes from,
    and every call_tir in the compiled main has a shaped output."""
    result = compile_ours(_range_graph())
    main = result.scheduled_module["main"]
    calls = []
    relax.analysis.post_order_visit(main.body, lambda e: calls.append(e) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.call_tir" else None)
    assert calls
    for call in calls:
        outs = call.ty_args[0]
        for ty in (outs.fields if isinstance(outs, relax.TupleType) else [outs]):
            assert ty.shape is not None, call
    names = [k["ops"] for k in result.report.kernels]
    assert not any("arange" in ops and "cast" in ops for ops in names), names
