"""Which operator TVM could not lower, when a build fails on one.

TVM's LegalizeOps skips an op whose input shape is known only at run time (``R.Tensor(ndim=4)``: a reshape or
concat after a slice whose bounds are read from an input); a later pass then fails deep inside TVM ("emit_te
now only supports Tensor that has ShapeExpr shape") and the user learns neither which op nor why. Where
``StaticShapeCanonicalizePass`` could not make the shape static, the pipeline asks ``unlowerable_op`` about the
module the failing phase started from and raises ``UnsupportedOpError`` naming the op, the binding and TVM's
limitation (``explain_failure``). A build that succeeds is not touched.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .errors import UnsupportedOpError

# Calls that stay high-level after LegalizeOps by design (lowered by the VM, not to kernels).
_NOT_KERNELS = ("relax.call_tir", "relax.call_dps_packed", "relax.call_pure_packed", "relax.call_inplace_packed",
                "relax.shape_of", "relax.tensor_to_shape", "relax.shape_to_tensor", "relax.null_value",
                "relax.call_builtin_with_ctx", "relax.make_closure", "relax.invoke_closure", "relax.print",
                "relax.assert_op")


def _unknown_shape_inputs(call: relax.Call) -> list:
    out = []
    for a in call.args:
        tys = a.ty.fields if isinstance(getattr(a, "ty", None), relax.TupleType) else [getattr(a, "ty", None)]
        out += [t for t in tys if isinstance(t, relax.TensorType) and t.shape is None]
    return out


def unlowerable_op(mod: tvm.IRModule) -> tuple[str, str, str] | None:
    """(op, binding, why) of the first op that LegalizeOps leaves high-level because an input's shape is
    known only at run time, else None."""
    try:
        legalized = relax.transform.LegalizeOps()(mod)
    except Exception:  # noqa: BLE001 - LegalizeOps itself failing: look at the ops as they are
        legalized = mod
    for func in legalized.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for block in getattr(func.body, "blocks", []):
            for b in block.bindings:
                v = getattr(b, "value", None)
                if not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)):
                    continue
                name = v.op.name
                if name in _NOT_KERNELS or name.startswith(("relax.builtin.", "relax.memory.", "relax.vm.")):
                    continue
                unknown = _unknown_shape_inputs(v)
                if unknown:
                    return (name.replace("relax.", ""), b.var.name,
                            f"its input {unknown[0]} has a shape known only at run time, and TVM's lowering "
                            "of this op needs static input shapes")
    return None


def explain_failure(mod: tvm.IRModule) -> UnsupportedOpError | None:
    """The user-facing error for a build that failed on ``mod`` (a phase's input), if an op is to blame."""
    found = unlowerable_op(mod)
    if found is None:
        return None
    op, where, why = found
    return UnsupportedOpError(f"TVM {tvm.__version__} cannot lower operator '{op}' (binding '{where}'): {why}")
