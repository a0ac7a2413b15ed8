"""Activation sub-patterns shared by the conv and matmul families.

Each activation is listed in every form an importer or the graph-fusion phase may leave it in (e.g. SiLU as
``nn.silu(x)`` or ``x * sigmoid(x)``; HardSwish as ONNX imports it, ``x * (clip(x + 3, 0, 6) / 6)``). The
constants are not checked: whatever they are, the fused kernel computes the same ops as the unfused graph.
"""

from __future__ import annotations

import re

from tvm.relax.dpl import DFPattern, GlobalVarPattern, TuplePattern, is_const, is_op, wildcard

from .checks import group_calls, name_of, op_name

UNARY_ACTIVATIONS = ("relax.nn.relu", "relax.sigmoid", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu",
                     "relax.nn.leakyrelu", "relax.tanh")


def _te_binary_with_const(x: DFPattern) -> DFPattern:
    """``call_tir(<PrimFunc>, (x, const))``: how the ONNX importer emits Clip with constant bounds
    (``emit_te(topi.maximum / topi.minimum)``). ``te_clamp_only`` checks which PrimFunc it is."""
    return is_op("relax.call_tir")(GlobalVarPattern(), TuplePattern([x, is_const()]), add_constraint=False)


def relu6(x: DFPattern) -> DFPattern:
    """clip(x, 0, 6), minimum(maximum(x, 0), 6), or ONNX Clip's call_tir(minimum, (call_tir(maximum, ...)))."""
    return (is_op("relax.clip")(x, wildcard(), wildcard())
            | is_op("relax.minimum")(is_op("relax.maximum")(x, is_const()), is_const())
            | _te_binary_with_const(_te_binary_with_const(x)))


def hardsigmoid(x: DFPattern) -> DFPattern:
    """clip(alpha * x + beta, 0, 1), as the ONNX importer writes HardSigmoid."""
    return is_op("relax.clip")(is_op("relax.add")(is_op("relax.multiply")(x, is_const()), is_const()),
                               wildcard(), wildcard())


def silu_mul(x: DFPattern) -> DFPattern:
    """x * sigmoid(x) (multiply is matched commutatively)."""
    return is_op("relax.multiply")(x, is_op("relax.sigmoid")(x))


def hardswish(x: DFPattern) -> DFPattern:
    """x * (clip(x + 3, 0, 6) / 6), as the ONNX importer writes HardSwish."""
    clipped = is_op("relax.clip")(is_op("relax.add")(x, is_const()), wildcard(), wildcard())
    return is_op("relax.multiply")(x, is_op("relax.divide")(clipped, is_const()))


def activation(x: DFPattern) -> DFPattern:
    """Any supported activation applied to ``x``. Multi-op forms come first so the longest form wins."""
    pat = hardswish(x) | hardsigmoid(x) | silu_mul(x) | relu6(x)
    for op in UNARY_ACTIVATIONS:
        pat = pat | is_op(op)(x)
    return pat


_CLAMP_PRIMFUNC = re.compile(r"^(maximum|minimum)(_?\d+)?$")


def te_clamp_only(ctx, target) -> "str | None":
    """A ``call_tir`` in the group must be one of the importer's clamp PrimFuncs (checked by name: the
    pattern itself matches any PrimFunc called with (tensor, constant))."""
    for var, call in group_calls(ctx):
        if op_name(call) == "relax.call_tir":
            callee = call.args[0]
            name = getattr(callee, "name_hint", "?")
            if not _CLAMP_PRIMFUNC.match(str(name)):
                return f"'{name_of(var)}' calls PrimFunc '{name}', not an elementwise maximum/minimum"
    return None
