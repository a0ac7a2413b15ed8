"""Squeeze-and-excitation (TbeSqueezeExciteFusionPass): the squeeze and both excitation FCs as one kernel.

    s = gate(FC2(act(FC1(mean(x, H, W)))))      then  y = x * s  (channel-wise, outside this group)

``FC`` is a 1x1 conv2d on the pooled (N, C, 1, 1) tensor (torchvision's ``SqueezeExcitation``) or a matmul on
the flattened (N, C) rows (an ``nn.Linear`` SE), each with an optional bias; ``act`` any activation of
``activations.py``; ``gate`` sigmoid or hardsigmoid. The group reads ``x`` once (the mean is computed where
it is read, over each channel's plane) and writes the (N, C[, 1, 1]) gate; the two FCs are tiny (C x C/r
weights) and run on the pooled vector in the same kernel, so the pooled vector and the hidden vector never
reach GM. The channel-wise multiply is left out on purpose: the grouping fuses it into the next conv's input
prologue (``grouping/conv_prologue.py``), so the scaled tensor never makes a round trip to GM either.

Checks: float dtypes, known shapes, intermediates private to the group; the mean reduces exactly the two
spatial axes of a 4-D NCHW tensor (keepdims), the FC convs are 1x1, stride 1, groups 1, NCHW/OIHW, the FC
matmuls have 2-D constant-shaped weights, a reshape in the group (the linear form's flatten) has a static target
shape. The kernel is scheduled by ``schedule/squeeze_excite.py``.
"""

from __future__ import annotations

from tvm import tirx
from tvm.relax.dpl import is_op, wildcard

from ..switches import TBE_SQUEEZE_EXCITE as SWITCH
from .activations import activation, hardsigmoid
from .checks import dims, float_dtypes, group_calls, known_shapes, op_name, private_intermediates, tensor_type
from .registry import PatternSpec, declare
from .working_set import Budget, add_cube_blocks


def _bias(x):
    return is_op("relax.add")(x, wildcard()) | x


def _gate(x):
    return is_op("relax.sigmoid")(x) | hardsigmoid(x)


def _conv_fc(x):
    return is_op("relax.nn.conv2d")(x, wildcard())


def _linear_fc(x):
    return is_op("relax.matmul")(x, wildcard())


def _flatten(x):
    return is_op("relax.reshape")(x, wildcard()) | is_op("relax.squeeze")(x) | x


def _build(fc, flat: bool):
    pooled = is_op("relax.mean")(wildcard())
    fc1_in = _flatten(pooled) if flat else pooled
    hidden = activation(_bias(fc(fc1_in)))
    gate = _gate(_bias(fc(hidden)))
    if flat:   # back to (N, C, 1, 1) for the multiply
        gate = is_op("relax.reshape")(gate, wildcard()) | gate
    return gate, pooled


def spatial_mean(ctx, target) -> "str | None":
    """The squeeze is the mean over H and W of a 4-D NCHW tensor, keeping the dims."""
    mean = ctx.annotated_expr["pool"]
    shape = dims(mean.args[0])
    if shape is None or len(shape) != 4:
        return f"squeeze input has rank {None if shape is None else len(shape)}, not 4 (NCHW)"
    axes = sorted(int(a) % 4 for a in mean.attrs.axis) if mean.attrs.axis is not None else None
    if axes != [2, 3]:
        return f"squeeze reduces axes {axes}, not the spatial axes [2, 3]"
    if not bool(mean.attrs.keepdims):
        return "squeeze does not keep the reduced dims"
    return None


def fc_shapes(ctx, target) -> "str | None":
    """The FCs are plain 1x1 convs (NCHW/OIHW, stride 1, groups 1) or 2-D matmuls."""
    for _, call in group_calls(ctx):
        name = op_name(call)
        if name == "relax.nn.conv2d":
            a = call.attrs
            wshape = dims(call.args[1])
            layouts = (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout))
            if layouts != ("NCHW", "OIHW", "NCHW"):
                return f"FC conv layout {layouts} is not NCHW/OIHW/NCHW"
            if int(a.groups) != 1 or wshape is None or wshape[2:] != [1, 1]:
                return f"FC conv is not a plain 1x1 conv (groups {int(a.groups)}, weight {wshape})"
            if any(int(s) != 1 for s in a.strides) or any(int(p) != 0 for p in a.padding):
                return "FC conv has a stride or padding"
        elif name == "relax.matmul":
            wshape = dims(call.args[1])
            if wshape is None or len(wshape) != 2 or not all(isinstance(d, int) for d in wshape):
                return f"FC matmul weight {wshape} is not a static 2-D matrix"
    return None


def static_reshapes(ctx, target) -> "str | None":
    """A reshape inside the group has a static target shape: a symbolic one (a dynamic batch) would become a
    parameter of the group function, which TVM's legalization of reshape does not accept."""
    for _, call in group_calls(ctx):
        if op_name(call) == "relax.reshape":
            shape = call.args[1]
            values = getattr(shape, "values", None)
            if values is None or not all(isinstance(v, tirx.IntImm) for v in values):
                return "reshape to a symbolic shape inside the group"
    return None


def se_working_set(ctx, target) -> int:
    """The pooled vector, the hidden vector and the gate (whole, they are tiny), one fractal step of an FC,
    and one aligned block of the input plane being averaged."""
    mean = ctx.annotated_expr["pool"]
    shape = dims(mean.args[0])
    channels = shape[1] if shape and isinstance(shape[1], int) else target.cube_n
    dtype = tensor_type(mean.args[0]).dtype
    budget = Budget(target)
    budget.add("se.plane_block", target.ub_align // 4, dtype)
    budget.add("se.pooled", channels, dtype)
    budget.add("se.gate", channels, dtype)
    budget.add("se.hidden", channels, dtype)      # at most C: the reduction ratio only shrinks it
    add_cube_blocks(budget, dtype, dtype, target, "se.fc")
    return budget.total()


CHECKS = (float_dtypes, known_shapes, private_intermediates, spatial_mean, fc_shapes, static_reshapes)


def _declare_all() -> None:
    for variant, fc, flat, description in (
            ("conv", _conv_fc, False, "global average pool -> 1x1 conv FC -> act -> 1x1 conv FC -> gate"),
            ("linear", _linear_fc, True, "global average pool -> flatten -> matmul FC -> act -> matmul FC -> "
                                         "gate (-> reshape)")):
        gate, pooled = _build(fc, flat)
        declare(PatternSpec(name=f"ascendfuse.squeeze_excite.{variant}", switch=SWITCH, pattern=gate,
                            annotations={"pool": pooled}, checks=CHECKS, working_set=se_working_set,
                            priority=200, description=description))


_declare_all()
