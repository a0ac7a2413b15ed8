"""Activation sub-patterns shared by the conv and matmul families.

Each activation is listed in every form an importer or the graph-fusion phase may leave it in (e.g. SiLU as
``nn.silu(x)`` or ``x * sigmoid(x)``; HardSwish as ONNX imports it, ``x * (clip(x + 3, 0, 6) / 6)``). The
constants are not checked: whatever they are, the fused kernel computes the same ops as the unfused graph.
"""

from __future__ import annotations

from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

UNARY_ACTIVATIONS = ("relax.nn.relu", "relax.sigmoid", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu",
                     "relax.nn.leakyrelu", "relax.tanh")


def relu6(x: DFPattern) -> DFPattern:
    """clip(x, 0, 6) or minimum(maximum(x, 0), 6)."""
    return (is_op("relax.clip")(x, wildcard(), wildcard())
            | is_op("relax.minimum")(is_op("relax.maximum")(x, is_const()), is_const()))


def silu_mul(x: DFPattern) -> DFPattern:
    """x * sigmoid(x) (multiply is matched commutatively)."""
    return is_op("relax.multiply")(x, is_op("relax.sigmoid")(x))


def hardswish(x: DFPattern) -> DFPattern:
    """x * (clip(x + 3, 0, 6) / 6), as the ONNX importer writes HardSwish."""
    clipped = is_op("relax.clip")(is_op("relax.add")(x, is_const()), wildcard(), wildcard())
    return is_op("relax.multiply")(x, is_op("relax.divide")(clipped, is_const()))


def activation(x: DFPattern) -> DFPattern:
    """Any supported activation applied to ``x``. Multi-op forms come first so the longest form wins."""
    pat = hardswish(x) | silu_mul(x) | relu6(x)
    for op in UNARY_ACTIVATIONS:
        pat = pat | is_op(op)(x)
    return pat
