"""Normalisations fused with their neighbours.

* LayerNorm feeding a linear layer (TbeLayerNormMatmulFusionPass): the normalised rows are the cube's left
  operand, so they never go back to GM. The vector unit normalises one full row at a time in UB and stages
  it in L1 until a fractal block of cube_m rows is complete: UB holds one row, L1 holds cube_m rows.
* RMSNorm feeding a linear layer (TbeRmsNormMatmulFusionPass), the same with RMSNorm: LLaMA's attention
  norm once its Q/K/V projections are one matmul (MatMulSiblingMergeFusionPass).
* residual add + LayerNorm / RMSNorm (TbeAddLayerNormFusionPass, TbeAddRmsNormFusionPass): the sum row is
  normalised while it is in UB. The sum may also be used later (pre-norm transformers add it to the next
  block's output): the group then returns it as a second output, as CANN's AddLayerNorm does.
"""

from __future__ import annotations

from tvm.relax.dpl import is_op, wildcard

from ..switches import TBE_ADD_LAYER_NORM as ADD_LN
from ..switches import TBE_ADD_RMS_NORM as ADD_RMS
from ..switches import TBE_LAYER_NORM_MATMUL as LN_MATMUL
from ..switches import TBE_RMS_NORM_MATMUL as RMS_MATMUL
from .activations import activation
from .checks import (dims, dtype_bytes, float_dtypes, known_shapes, min_rank, norm_axes, private_except,
                     private_intermediates, static_axes, tensor_type)
from .registry import PatternSpec, declare
from .working_set import Budget, add_cube_blocks, add_epilogue, cube_out_tile, row_tile


def _layer_norm(x):
    return is_op("relax.nn.layer_norm")(x, wildcard(), wildcard())


def _rms_norm(x):
    return is_op("relax.nn.rms_norm")(x, wildcard())


# ---- LayerNorm + matmul --------------------------------------------------------------------------------
def normalises_k_axis(ctx, target) -> "str | None":
    """Only a norm over the last axis alone produces whole rows of the matmul's left operand."""
    ln = ctx.annotated_expr["norm"]
    ndim = len(dims(ln.args[0]))
    if norm_axes(ln, ndim) != [ndim - 1]:
        what = ln.op.name.replace("relax.nn.", "")
        return f"{what} axes {[int(a) for a in ln.attrs.axes]} are not just the last axis"
    return None


def layer_norm_matmul_working_set(ctx, target) -> int:
    """The vector unit normalises one full row at a time (input row, normalised row, gamma, beta, row
    statistics) and stages it into the cube's left-operand buffer; then one cube step and the epilogue on one
    output block."""
    ln, mm = ctx.annotated_expr["norm"], ctx.annotated_expr["matmul"]
    x = ln.args[0]
    k = dims(x)[-1]
    dtype = tensor_type(x).dtype
    budget = Budget(target)
    budget.add("ln.in", k, dtype)
    budget.add("ln.out", k, tensor_type(ctx.value_to_bound_var[ln]).dtype)
    budget.add("ln.gamma", k, tensor_type(ln.args[1]).dtype)
    if len(ln.args) > 2:                                    # LayerNorm's beta (RMSNorm has none)
        budget.add("ln.beta", k, tensor_type(ln.args[2]).dtype)
    budget.add("ln.stats", 2, "float32")
    add_cube_blocks(budget, dtype, tensor_type(mm.args[1]).dtype, target, "matmul")
    mm_var = ctx.value_to_bound_var[mm]
    budget.add("matmul.out", target.cube_m * target.cube_n, tensor_type(mm_var).dtype)
    add_epilogue(budget, ctx, [mm_var, ctx.value_to_bound_var[ln]], lambda s: cube_out_tile(s, target))
    return budget.total()


def operand_rows_fit_l1(ctx, target) -> "str | None":
    """The cube consumes cube_m normalised rows at once; they wait in L1 (not UB) until the block is full."""
    ln = ctx.annotated_expr["norm"]
    k = dims(ln.args[0])[-1]
    need = target.align_up(target.cube_m * k * dtype_bytes(tensor_type(ctx.value_to_bound_var[ln]).dtype), "l1")
    if need > target.l1_bytes:
        return f"{target.cube_m} normalised rows of {k} need {need} bytes of L1, have {target.l1_bytes}"
    return None


def _norm_matmul_checks(what):
    return (float_dtypes, known_shapes, static_axes("norm", norm_axes, what), normalises_k_axis,
            operand_rows_fit_l1, min_rank("rhs", 2, "matmul right operand"), private_intermediates)


LN_MATMUL_CHECKS = _norm_matmul_checks("layer_norm")

LN_MATMUL_VARIANTS = (
    ("layer_norm_matmul_bias_act", lambda m: activation(is_op("relax.add")(m, wildcard())), 160,
     "layer_norm -> matmul + bias + activation"),
    ("layer_norm_matmul_bias", lambda m: is_op("relax.add")(m, wildcard()), 150, "layer_norm -> matmul + bias"),
    ("layer_norm_matmul", lambda m: m, 130, "layer_norm -> matmul"),
)


# ---- add + norm ----------------------------------------------------------------------------------------
def add_norm_working_set(ctx, target) -> int:
    """One full row of each addend, of the sum, of gamma (and beta), of the output, plus the row statistics."""
    norm = ctx.annotated_expr["norm"]
    shape = dims(norm.args[0])
    axes = norm_axes(norm, len(shape))
    budget = Budget(target)
    add_epilogue(budget, ctx, (), lambda s: row_tile(s, axes))
    budget.add("norm.stats", 2, "float32")
    return budget.total()


def _add_norm_checks(what):
    return (float_dtypes, known_shapes, static_axes("norm", norm_axes, what), private_except("add"))


def _declare_all() -> None:
    for norm_of, what, switch in ((_layer_norm, "layer_norm", LN_MATMUL), (_rms_norm, "rms_norm", RMS_MATMUL)):
        for variant, build, priority, description in LN_MATMUL_VARIANTS:
            x = wildcard()
            ln = norm_of(x)
            rhs = wildcard()
            mm = is_op("relax.matmul")(ln, rhs)
            declare(PatternSpec(name=f"ascendfuse.norm.{variant.replace('layer_norm', what)}", switch=switch,
                                pattern=build(mm), annotations={"norm": ln, "matmul": mm, "rhs": rhs},
                                checks=_norm_matmul_checks(what), working_set=layer_norm_matmul_working_set,
                                priority=priority, description=description.replace("layer_norm", what)))
    for name, switch, norm_of, what in (("add_layer_norm", ADD_LN, _layer_norm, "layer_norm"),
                                        ("add_rms_norm", ADD_RMS, _rms_norm, "rms_norm")):
        add = is_op("relax.add")(wildcard(), wildcard())
        norm = norm_of(add)
        declare(PatternSpec(name=f"ascendfuse.norm.{name}", switch=switch, pattern=norm,
                            annotations={"norm": norm, "add": add}, checks=_add_norm_checks(what),
                            working_set=add_norm_working_set, priority=90,
                            description=f"residual add + {what}"))


_declare_all()
