"""SwiGLU, ``silu(gate) * up`` (TbeSwiGluFusionPass).

Two forms: the elementwise part alone, and the whole gated linear unit ``silu(x·Wg) * (x·Wu)`` with both
projections of the same x. For the latter one tile is one fractal step of each matmul (sharing the x block)
plus the gate/up/result blocks, so it fits any UB we model; the working set still proves it.
"""

from __future__ import annotations

from tvm.relax.dpl import is_op, wildcard

from ..switches import TBE_SWIGLU as SWITCH
from .checks import dims, float_dtypes, known_shapes, min_rank, private_intermediates, tensor_type
from .registry import PatternSpec, declare
from .working_set import Budget, add_cube_blocks, add_epilogue, cube_out_tile, elementwise_working_set


def silu(x):
    return is_op("relax.nn.silu")(x) | is_op("relax.multiply")(x, is_op("relax.sigmoid")(x))


def same_gate_up_shape(ctx, target) -> "str | None":
    g, u = (dims(ctx.value_to_bound_var[ctx.annotated_expr[k]]) for k in ("gate", "up"))
    if g is None or u is None or len(g) != len(u) or any(
            isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(g, u)):
        return f"gate {g} and up {u} projections differ in shape"
    return None


def swiglu_matmul_working_set(ctx, target) -> int:
    gate, up = ctx.annotated_expr["gate"], ctx.annotated_expr["up"]
    budget = Budget(target)
    add_cube_blocks(budget, tensor_type(gate.args[0]).dtype, tensor_type(gate.args[1]).dtype, target, "gate")
    budget.add("up.b", target.cube_k * target.cube_n, tensor_type(up.args[1]).dtype)   # x block is shared
    budget.add("up.acc", target.cube_m * target.cube_n, "float32")
    skip = []
    for key in ("gate", "up"):
        var = ctx.value_to_bound_var[ctx.annotated_expr[key]]
        budget.add(f"{key}.out", target.cube_m * target.cube_n, tensor_type(var).dtype)
        skip.append(var)
    add_epilogue(budget, ctx, skip, lambda s: cube_out_tile(s, target))
    return budget.total()


def _declare_all() -> None:
    x, wg, wu = wildcard(), wildcard(), wildcard()
    gate, up = is_op("relax.matmul")(x, wg), is_op("relax.matmul")(x, wu)
    declare(PatternSpec(
        name="ascendfuse.swiglu.matmul", switch=SWITCH, pattern=is_op("relax.multiply")(silu(gate), up),
        annotations={"x": x, "gate": gate, "up": up},
        checks=(float_dtypes, known_shapes, min_rank("x", 2, "input"), same_gate_up_shape, private_intermediates),
        working_set=swiglu_matmul_working_set, priority=170,
        description="silu(x·Wg) * (x·Wu) with both projections in the kernel"))
    declare(PatternSpec(
        name="ascendfuse.swiglu.elementwise", switch=SWITCH,
        pattern=is_op("relax.multiply")(silu(wildcard()), wildcard()),
        checks=(float_dtypes, known_shapes, private_intermediates), working_set=elementwise_working_set,
        priority=150, description="silu(gate) * up"))


_declare_all()
