"""matmul / linear with its epilogue: bias, activation, residual add (TbeMatmulElemwiseFusionPass).

As for conv: the accumulator block leaves the cube into UB, the epilogue runs there, one store to GM.
A Gemm is canonicalised by graph fusion to ``matmul + add``; a ``permute_dims`` of the weight that is not a
constant stays a separate op.
"""

from __future__ import annotations

from tvm.relax.dpl import is_op, wildcard

from ..switches import TBE_MATMUL_ELEMWISE as SWITCH
from .activations import activation, te_clamp_only
from .checks import float_dtypes, known_shapes, min_rank, private_intermediates, tensor_type
from .registry import PatternSpec, declare
from .working_set import Budget, add_cube_blocks, add_epilogue, cube_out_tile


def _add(x):
    return is_op("relax.add")(x, wildcard())


def matmul_working_set(ctx, target) -> int:
    """One cube_m x cube_k x cube_n fractal step plus the epilogue on one cube_m x cube_n output block."""
    mm = ctx.annotated_expr["matmul"]
    budget = Budget(target)
    add_cube_blocks(budget, tensor_type(mm.args[0]).dtype, tensor_type(mm.args[1]).dtype, target, "matmul")
    mm_var = ctx.value_to_bound_var[mm]
    tile_of = lambda s: cube_out_tile(s, target)  # noqa: E731
    budget.add("matmul.out", target.cube_m * target.cube_n, tensor_type(mm_var).dtype)
    add_epilogue(budget, ctx, [mm_var], tile_of)
    return budget.total()


CHECKS = (float_dtypes, known_shapes, min_rank("lhs", 2, "matmul left operand"),
          min_rank("rhs", 2, "matmul right operand"), private_intermediates, te_clamp_only)

VARIANTS = (
    ("bias_act_residual", lambda m: _add(activation(_add(m))), 140, "matmul + bias + activation + residual add"),
    ("bias_residual_act", lambda m: activation(_add(_add(m))), 140, "matmul + bias + residual add + activation"),
    ("bias_act", lambda m: activation(_add(m)), 120, "matmul + bias + activation"),
    ("bias_residual", lambda m: _add(_add(m)), 110, "matmul + bias + residual add"),
    ("act", lambda m: activation(m), 100, "matmul + activation"),
    ("bias", lambda m: _add(m), 100, "matmul + bias (or residual) add"),
)


def make_matmul():
    """matmul(lhs, rhs) with the operands annotated (shared by the LayerNorm+matmul and SwiGLU families)."""
    lhs, rhs = wildcard(), wildcard()
    return is_op("relax.matmul")(lhs, rhs), lhs, rhs


def _declare_all() -> None:
    for variant, build, priority, description in VARIANTS:
        mm, lhs, rhs = make_matmul()
        declare(PatternSpec(name=f"ascendfuse.matmul.{variant}", switch=SWITCH, pattern=build(mm),
                            annotations={"matmul": mm, "lhs": lhs, "rhs": rhs}, checks=CHECKS,
                            working_set=matmul_working_set, priority=priority, description=description))


_declare_all()
