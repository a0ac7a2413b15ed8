"""SafeFoldConstant skips FoldConstant when no call has only constant arguments (FoldConstant would
legalize every call just to find nothing), and still folds constant sub-expressions when there are some."""

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op

from tvm_ascendfuse.graph_fusion.safe_fold import SafeFoldConstant, has_foldable_call


def _module(const_expr: bool):
    rng = np.random.default_rng(0)
    w = relax.const(rng.standard_normal((8, 8)).astype("float32"))
    s = relax.const(rng.standard_normal((8,)).astype("float32"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            weight = bb.emit(op.multiply(w, s)) if const_expr else w     # e.g. a BN scale folded into w
            t = bb.emit(op.permute_dims(weight)) if const_expr else weight   # constant through a bound var
            out = bb.emit_output(op.nn.relu(op.matmul(x, t)))
        bb.emit_func_output(out)
    return bb.get()


def _calls(mod):
    found = []
    relax.analysis.post_order_visit(mod["main"].body, lambda e: found.append(e.op.name)
                                    if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return found


def test_nothing_to_fold_returns_the_same_module():
    mod = _module(const_expr=False)
    assert not has_foldable_call(mod)
    assert SafeFoldConstant()(mod).same_as(mod)


def test_constant_subexpressions_are_still_folded():
    mod = _module(const_expr=True)
    assert has_foldable_call(mod)
    folded = SafeFoldConstant()(mod)
    calls = _calls(folded)
    assert "relax.multiply" not in calls and "relax.permute_dims" not in calls
    assert "relax.matmul" in calls
