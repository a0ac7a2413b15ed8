"""Checks and shape helpers shared by every pattern family.

A check has the signature ``(ctx: PatternCheckContext, target: AscendTarget) -> None | str``: ``None`` lets the
match fuse, a string says why it may not (it ends up in the fusion report). Families compose these; nothing
here knows about a particular family.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from tvm import relax

from ..ir import dims, dtype_bytes, op_name, tensor_type  # noqa: F401 - the pattern families import them from here

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


# ---- type and shape helpers (``ir.dims``, ``ir.dtype_bytes``, ``ir.op_name``, ``ir.tensor_type``) -------
def static_product(shape) -> "int | None":
    """Element count of a shape, or None when any dim is symbolic."""
    n = 1
    for d in shape:
        if not isinstance(d, int):
            return None
        n *= d
    return n


def row_length(expr, axes: Iterable[int]) -> "int | None":
    """Elements along the reduced ``axes`` of ``expr`` (one 'row' of a reduction), None if symbolic."""
    shape = dims(expr)
    if shape is None:
        return None
    return static_product([shape[a % len(shape)] for a in axes])


def name_of(var) -> str:
    return getattr(var, "name", None) or getattr(var, "name_hint", "?")


def _op_label(call) -> str:
    """An op's name for a message ("?" for a call that is not a Relax op)."""
    return op_name(call) or "?"


# ---- group structure ----------------------------------------------------------------------------------
def root_var(ctx):
    return ctx.value_to_bound_var.get(ctx.matched_expr)


def group_calls(ctx) -> Iterator[tuple[relax.Var, relax.Call]]:
    for var, value in ctx.matched_bindings.items():
        if isinstance(value, relax.Call):
            yield var, value


def annotated_var(ctx, key):
    expr = ctx.annotated_expr.get(key)
    return None if expr is None else ctx.value_to_bound_var.get(expr)


# ---- checks -------------------------------------------------------------------------------------------
def float_dtypes(ctx, target) -> "str | None":
    """The cube and vector units we model compute in float32/float16/bfloat16 only."""
    for var, call in group_calls(ctx):
        for expr, what in [(var, f"result of {_op_label(call)}")] + [(a, f"input of {_op_label(call)}")
                                                                       for a in call.args]:
            ty = tensor_type(expr)
            if ty is not None and str(ty.dtype) not in FLOAT_DTYPES:
                return f"dtype {ty.dtype} ({what}) is not one of {'/'.join(FLOAT_DTYPES)}"
    return None


def known_shapes(ctx, target) -> "str | None":
    """Working sets need the rank of every tensor (dims may be symbolic)."""
    for var, call in group_calls(ctx):
        if tensor_type(var) is not None and dims(var) is None:
            return f"result of {_op_label(call)} has unknown shape"
    return None


def _escapes(ctx, allowed: set) -> "str | None":
    inside = set(ctx.matched_bindings.keys())
    root = root_var(ctx)
    for var, value in ctx.matched_bindings.items():
        if var.same_as(root) or var in allowed:
            continue
        what = _op_label(value) if isinstance(value, relax.Call) else type(value).__name__
        if not isinstance(var, relax.DataflowVar):
            return f"intermediate '{name_of(var)}' ({what}) is an output of the dataflow block"
        others = [u for u in ctx.var_usages.get(var, []) if u not in inside]
        if others:
            return (f"intermediate '{name_of(var)}' ({what}) is also used outside the group by "
                    f"{', '.join(name_of(u) for u in others)}")
    return None


def private_intermediates(ctx, target) -> "str | None":
    """Every value made inside the group is consumed only inside it (else the kernel would need a second
    output, and the fused group would not replace the producer)."""
    return _escapes(ctx, set())


def private_except(*keys: str):
    """Like private_intermediates, but the annotated values ``keys`` may escape: the group then returns
    them as extra outputs (a deliberate multi-output kernel, e.g. AddLayerNorm's residual sum)."""

    def private_intermediates_except(ctx, target) -> "str | None":
        allowed = {v for v in (annotated_var(ctx, k) for k in keys) if v is not None}
        return _escapes(ctx, allowed)

    private_intermediates_except.__name__ = f"private_intermediates_except_{'_'.join(keys)}"
    return private_intermediates_except


def static_axes(key: str, axes_of, what: str):
    """The reduced axes of the annotated op ``key`` have static length (one full row must fit in UB)."""

    def static_reduced_axes(ctx, target) -> "str | None":
        call = ctx.annotated_expr.get(key)
        if call is None:
            return None
        data = call.args[0]
        shape = dims(data)
        if shape is None:
            return f"{what} input has unknown shape"
        axes = axes_of(call, len(shape))
        if row_length(data, axes) is None:
            return f"{what} row length along axis {list(axes)} is symbolic; cannot prove one row fits in UB"
        return None

    static_reduced_axes.__name__ = f"static_{key}_row"
    return static_reduced_axes


def min_rank(key: str, rank: int, what: str):
    """The annotated value has at least ``rank`` dims (1-D matmul operands are not cube tiles)."""

    def has_min_rank(ctx, target) -> "str | None":
        expr = ctx.annotated_expr.get(key)
        shape = dims(expr) if expr is not None else None
        if shape is None:
            return f"{what} has unknown shape"
        if len(shape) < rank:
            return f"{what} has rank {len(shape)}, need >= {rank}"
        return None

    has_min_rank.__name__ = f"{key}_rank_ge_{rank}"
    return has_min_rank


def softmax_axes(call, ndim):
    return [int(call.attrs.axis) % ndim]


def norm_axes(call, ndim):
    return [int(a) % ndim for a in call.attrs.axes]
