"""conv2d with its epilogue: bias or inference batch_norm, activation, residual add (TbeConvElemwiseFusionPass).

The cube unit writes one output block to UB; everything after it that works per element (or per channel)
runs on that block before it leaves the core. "bias" in a variant name is any add of a broadcastable
tensor (a folded BatchNorm's bias, a residual, a real bias) or an inference ``batch_norm(...)[0]`` when the
BN parameters are not constants and the graph-fusion phase could not fold them.
"""

from __future__ import annotations

from tvm.relax.dpl import is_op, is_tuple_get_item, wildcard

from ..switches import TBE_CONV_ELEMWISE as SWITCH
from .activations import activation, te_clamp_only
from .checks import dims, float_dtypes, group_calls, known_shapes, op_name, private_intermediates, tensor_type
from .registry import PatternSpec, declare
from .working_set import Budget, add_cube_blocks, add_epilogue, clamp


def _batch_norm0(x):
    bn = is_op("relax.nn.batch_norm")(x, wildcard(), wildcard(), wildcard(), wildcard())
    return is_tuple_get_item(bn, 0)


def _bias(x):
    """add(x, bias) | batch_norm(x)[0] | batch_norm(add(x, bias))[0]."""
    return (_batch_norm0(is_op("relax.add")(x, wildcard())) | _batch_norm0(x)
            | is_op("relax.add")(x, wildcard()))


def _residual(x):
    return is_op("relax.add")(x, wildcard())


def nchw_layout(ctx, target) -> "str | None":
    """Our conv tiling (and the epilogue's channel broadcast) assumes NCHW data and OIHW weights."""
    conv = ctx.annotated_expr["conv"]
    a = conv.attrs
    out_layout = str(a.out_layout) if a.out_layout else str(a.data_layout)
    if (str(a.data_layout), str(a.kernel_layout), out_layout) != ("NCHW", "OIHW", "NCHW"):
        return f"conv2d layout {a.data_layout}/{a.kernel_layout}->{out_layout} is not NCHW/OIHW->NCHW"
    return None


def batch_norm_inference(ctx, target) -> "str | None":
    """Training-mode batch_norm needs statistics over the whole batch: no output tile is local."""
    for _, call in group_calls(ctx):
        if op_name(call) == "relax.nn.batch_norm":
            if bool(call.attrs.training):
                return "batch_norm has training=True (batch statistics need the whole tensor)"
            if int(call.attrs.axis) % 4 != 1:
                return f"batch_norm axis {call.attrs.axis} is not the channel axis of NCHW"
    return None


def conv_working_set(ctx, target) -> int:
    """One fractal step of the implicit GEMM (pixels x (IC*KH*KW) times (IC*KH*KW) x OC) plus the epilogue
    on a [1, cube_n channels, 1, cube_m pixels] output block."""
    conv = ctx.annotated_expr["conv"]
    budget = Budget(target)
    add_cube_blocks(budget, tensor_type(conv.args[0]).dtype, tensor_type(conv.args[1]).dtype, target, "conv")
    tile_of = lambda s: [1, clamp(s[1], target.cube_n), 1, clamp(s[3], target.cube_m)]  # noqa: E731
    conv_var = ctx.value_to_bound_var[conv]
    out = dims(conv_var)
    budget.add("conv.out", tile_of(out)[1] * tile_of(out)[3], tensor_type(conv_var).dtype)
    add_epilogue(budget, ctx, [conv_var], tile_of)
    return budget.total()


CHECKS = (float_dtypes, known_shapes, nchw_layout, batch_norm_inference, private_intermediates, te_clamp_only)

# (variant, builder from the conv pattern to the whole chain, priority, description). Longer chains first.
VARIANTS = (
    ("bias_residual_act", lambda c: activation(_residual(_bias(c))), 140,
     "conv2d + bias/BN + residual add + activation (ResNet block tail)"),
    ("bias_act_residual", lambda c: _residual(activation(_bias(c))), 140,
     "conv2d + bias/BN + activation + residual add"),
    ("bias_act", lambda c: activation(_bias(c)), 120, "conv2d + bias/BN (or residual) + activation"),
    ("bias_residual", lambda c: _residual(_bias(c)), 110, "conv2d + bias/BN + residual add"),
    ("act", lambda c: activation(c), 100, "conv2d + activation"),
    ("bias", lambda c: _bias(c), 100, "conv2d + bias add (or residual add) or inference batch_norm"),
)


def _declare_all() -> None:
    for variant, build, priority, description in VARIANTS:
        conv = is_op("relax.nn.conv2d")(wildcard(), wildcard())
        declare(PatternSpec(name=f"ascendfuse.conv2d.{variant}", switch=SWITCH, pattern=build(conv),
                            annotations={"conv": conv}, checks=CHECKS, working_set=conv_working_set,
                            priority=priority, description=description))


_declare_all()
