"""Small facts about Relax and TIR values that every layer asks: op names, shapes, element sizes, call_tir.

One definition each, so a pattern check, a graph rewrite, the grouping pass and the traffic count agree on
what a dtype weighs or what an op is called.
"""

from __future__ import annotations

import tvm
from tvm import relax

CALL_TIR = tvm.ir.Op.get("relax.call_tir")

# Function attribute: the 16-bit float dtype a function's float32 tensors and constants were stored in before
# the precision phase widened them (``precision/compute_fp32.py``). Graph rewrites compare the constants
# they match (GELU's 1/sqrt(2)) with the tolerance of that dtype: they carry its rounding, not float32's.
STORED_FLOAT_ATTR = "ascendfuse.stored_float"


def op_name(call) -> str | None:
    """``"relax.add"`` for a call of a Relax op; None for anything else (a call of a function, a var)."""
    if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op):
        return call.op.name
    return None


def is_call_tir(expr) -> bool:
    """Is ``expr`` a ``call_tir`` (a launch of one PrimFunc)?"""
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.same_as(CALL_TIR)


def dtype_bytes(dtype) -> int:
    """Bytes of one element of ``dtype`` (a string or DataType): its bits rounded up to whole bytes, at least
    1 (bool and sub-byte types take one byte each; so does ``void``, the dtype of a tensor nothing knows)."""
    t = tvm.DataType(str(dtype))
    return max(1, -(-t.bits * max(1, t.lanes) // 8))


def tensor_type(expr) -> "relax.TensorType | None":
    ty = getattr(expr, "ty", None)
    return ty if isinstance(ty, relax.TensorType) else None


def _shape_values(expr):
    """The dims of a tensor-typed expression whose rank is known (a ShapeExpr), else None."""
    ty = tensor_type(expr)
    if ty is None or ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return list(ty.shape.values)


def dims(expr) -> "list[int | tvm.tirx.PrimExpr] | None":
    """Shape of a tensor expression: ints for static dims, PrimExprs for symbolic ones; None if the rank is
    unknown."""
    values = _shape_values(expr)
    if values is None:
        return None
    return [int(v.value) if isinstance(v, tvm.tirx.IntImm) else v for v in values]


def static_dims(expr) -> "list[int | None] | None":
    """Like ``dims``, with None for each symbolic dim."""
    values = _shape_values(expr)
    if values is None:
        return None
    return [int(v.value) if isinstance(v, tvm.tirx.IntImm) else None for v in values]


def static_shape(expr) -> tuple[int, ...] | None:
    """The shape of a tensor-typed expression when every dim is static, else None."""
    shape = static_dims(expr)
    if shape is None or None in shape:
        return None
    return tuple(shape)
