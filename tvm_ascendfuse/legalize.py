"""TVM's LegalizeOps as the pipeline runs it, and which operator TVM could not lower when a build fails on one.

``legalize_ops()`` is TVM's LegalizeOps with one lowering of ours: ``relax.take`` in its default ``fast`` mode
(every ONNX Gather: TVM's importer makes negative indices positive first) is the same gather TOPI builds,
without the warning TOPI logs each time it builds one ("Fast mode segfaults when there are out-of-bounds
indices"), which a user compiling a Transformer saw once per embedding lookup and could do nothing about.

TVM's LegalizeOps skips an op whose input shape is known only at run time (``R.Tensor(ndim=4)``: a reshape or
concat after a slice whose bounds are read from an input); a later pass then fails deep inside TVM ("emit_te
now only supports Tensor that has ShapeExpr shape") and the user learns neither which op nor why. Where
``StaticShapeCanonicalizePass`` could not make the shape static, the pipeline asks ``unlowerable_op`` about the
module the failing phase started from and raises ``UnsupportedOpError`` naming the op, the binding and TVM's
limitation (``explain_failure``). A build that succeeds is not touched.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, topi

from .errors import UnsupportedOpError


def _take(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``relax.take``: TOPI's gather, with the ``fast`` mode's compute written here (TOPI logs a warning per
    build of it); other modes and a flattening take (no axis) are TOPI's own."""
    data, indices = call.args
    axis, mode = call.attrs.axis, call.attrs.mode
    if mode != "fast" or axis is None:
        return bb.call_te(topi.take, data, indices, axis, mode=mode)

    def gather(a, idx):
        ax = int(axis) % len(a.shape)
        q = len(idx.shape)

        def value(*i):
            return a(*i[:ax], idx(*i[ax:ax + q]), *i[ax + q:])

        return te.compute([*a.shape[:ax], *idx.shape, *a.shape[ax + 1:]], value, name="T_take", tag="injective")

    return bb.call_te(gather, data, indices, primfunc_name_hint="take")


# Our lowerings in place of TVM's, by op name.
LEGALIZE_MAP = {"relax.take": _take}


def legalize_ops() -> tvm.transform.Pass:
    """TVM's LegalizeOps with ``LEGALIZE_MAP``."""
    return relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE_MAP)

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
        legalized = legalize_ops()(mod)
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
