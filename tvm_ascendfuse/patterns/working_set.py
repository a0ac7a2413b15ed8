"""UB bytes of the smallest legal tile of a fused group.

The rule every family follows: count one tile of each input, each live intermediate and each output, each
buffer rounded up to the UB alignment, times two when the target double-buffers. What "smallest legal tile"
means depends on the anchor op:

* cube ops (matmul, conv2d): one fractal block, ``cube_m x cube_k`` of the left operand, ``cube_k x cube_n`` of
  the right one, ``cube_m x cube_n`` of the float32 accumulator; the epilogue works on that output block;
* reductions (softmax, layer_norm, rms_norm): one full row along the reduced axes, since no element of the
  result is known before the whole row has been read;
* elementwise ops: one aligned UB block per buffer.

If the figure exceeds ``target.ub_usable`` the registry refuses the match as ``ub_overflow``.
"""

from __future__ import annotations

from typing import Callable, Iterable

from tvm import relax

from .checks import dims, dtype_bytes, group_calls, name_of, op_name, static_product, tensor_type

ACCUMULATOR_DTYPE = "float32"


class Budget:
    """The buffers one tile of a fused group holds in UB at the same time."""

    def __init__(self, target):
        self.target = target
        self.items: list[tuple[str, int]] = []

    def add(self, what: str, elems: int, dtype) -> None:
        self.items.append((what, self.target.align_up(max(1, int(elems)) * dtype_bytes(dtype), "ub")))

    def total(self) -> int:
        raw = sum(b for _, b in self.items)
        return raw * (2 if self.target.double_buffer else 1)


def clamp(d, cap: int) -> int:
    """A tile extent: ``cap`` elements, or the whole dim when it is smaller (symbolic dims count as large)."""
    return min(d, cap) if isinstance(d, int) else cap


def operand_tile(operand_shape, result_shape, result_tile) -> int:
    """Elements of a (numpy-broadcast) operand needed for one tile of the result."""
    if operand_shape is None:
        return static_product(result_tile) or 1
    offset = len(result_shape) - len(operand_shape)
    n = 1
    for i, d in enumerate(operand_shape):
        j = i + offset
        if j < 0 or (isinstance(d, int) and d == 1):
            continue
        n *= result_tile[j]
    return n


def cube_out_tile(shape, target, m_axis: int = -2, n_axis: int = -1) -> list[int]:
    """One cube_m x cube_n block of a result; every other axis is 1."""
    tile = [1] * len(shape)
    tile[m_axis] = clamp(shape[m_axis], target.cube_m)
    tile[n_axis] = clamp(shape[n_axis], target.cube_n)
    return tile


def row_tile(shape, axes: Iterable[int]) -> list[int]:
    """One full row along ``axes`` (which must be static); every other axis is 1. A scalar (rank 0, e.g. a
    scale computed at run time that the group reads) is its own tile."""
    if not shape:
        return []
    axes = {a % len(shape) for a in axes}
    return [shape[i] if i in axes else 1 for i in range(len(shape))]


def add_cube_blocks(budget: Budget, a_dtype, b_dtype, target, what: str = "cube") -> None:
    """Left operand, right operand and accumulator blocks of one fractal step."""
    budget.add(f"{what}.a", target.cube_m * target.cube_k, a_dtype)
    budget.add(f"{what}.b", target.cube_k * target.cube_n, b_dtype)
    budget.add(f"{what}.acc", target.cube_m * target.cube_n, ACCUMULATOR_DTYPE)


def add_epilogue(budget: Budget, ctx, skip, tile_of: Callable[[list], list[int]]) -> None:
    """One tile of every value the group computes (except the ``skip`` anchor vars, counted by the caller)
    and of every outside tensor those computations read, broadcast-aware."""
    inside = set(ctx.matched_bindings.keys())
    skip = set(skip)
    for var, call in group_calls(ctx):
        if var in skip:
            continue
        if op_name(call) == "relax.nn.batch_norm":
            _add_batch_norm(budget, call, inside, tile_of)
            continue
        shape = dims(var)
        if shape is None:
            continue
        tile = tile_of(shape)
        budget.add(name_of(var), static_product(tile), tensor_type(var).dtype)
        for arg in call.args:
            if isinstance(arg, relax.Var) and arg in inside:
                continue
            ty = tensor_type(arg)
            if ty is not None:
                budget.add(f"{name_of(var)}.in", operand_tile(dims(arg), shape, tile), ty.dtype)


def _add_batch_norm(budget: Budget, call, inside, tile_of) -> None:
    """batch_norm's parameters are vectors along ``axis`` (not numpy-broadcast)."""
    shape = dims(call.args[0])
    if shape is None:
        return
    tile = tile_of(shape)
    axis = int(call.attrs.axis) % len(shape)
    budget.add("batch_norm.out", static_product(tile), tensor_type(call.args[0]).dtype)
    for arg in call.args[1:]:
        ty = tensor_type(arg)
        if ty is not None and not (isinstance(arg, relax.Var) and arg in inside):
            budget.add("batch_norm.param", tile[axis], ty.dtype)


def elementwise_working_set(ctx, target) -> int:
    """One aligned UB block per input, intermediate and output."""
    block = lambda shape: [1] * len(shape)  # noqa: E731  (align_up lifts one element to one block)
    budget = Budget(target)
    add_epilogue(budget, ctx, (), block)
    return budget.total()
