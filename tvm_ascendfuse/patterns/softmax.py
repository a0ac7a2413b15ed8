"""Scaled / masked softmax (TbeSoftmaxFusionPass): ``softmax(x * s + mask)`` reads x once.

The scale and mask are applied to the row while it is in UB; one full row along the softmax axis must fit.
"""

from __future__ import annotations

from tvm.relax.dpl import is_op, wildcard

from ..switches import TBE_SOFTMAX as SWITCH
from .checks import dims, float_dtypes, known_shapes, private_intermediates, softmax_axes, static_axes
from .registry import PatternSpec, declare
from .working_set import Budget, add_epilogue, row_tile


def scaled(x):
    """x * s or x / s (multiply matched commutatively)."""
    return is_op("relax.multiply")(x, wildcard()) | is_op("relax.divide")(x, wildcard())


def masked(x):
    return is_op("relax.add")(x, wildcard())


def softmax_row_working_set(ctx, target) -> int:
    """One full row of every operand, intermediate and output, plus a float32 row for exp(x - max)."""
    sm = ctx.annotated_expr["softmax"]
    shape = dims(sm.args[0])
    axes = softmax_axes(sm, len(shape))
    budget = Budget(target)
    add_epilogue(budget, ctx, (), lambda s: row_tile(s, axes))
    budget.add("softmax.exp", row_tile(shape, axes)[axes[0]], "float32")
    budget.add("softmax.stats", 2, "float32")
    return budget.total()


CHECKS = (float_dtypes, known_shapes, static_axes("softmax", softmax_axes, "softmax"), private_intermediates)

VARIANTS = (
    ("scale_mask", lambda x: masked(scaled(x)), 80, "softmax(x * scale + mask)"),
    ("scale", scaled, 70, "softmax(x * scale) or softmax(x / scale)"),
    ("mask", masked, 70, "softmax(x + mask)"),
)


def _declare_all() -> None:
    for variant, build, priority, description in VARIANTS:
        sm = is_op("relax.nn.softmax")(build(wildcard()))
        declare(PatternSpec(name=f"ascendfuse.softmax.{variant}", switch=SWITCH, pattern=sm,
                            annotations={"softmax": sm}, checks=CHECKS, working_set=softmax_row_working_set,
                            priority=priority, description=description))


_declare_all()
