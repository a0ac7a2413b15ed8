"""Scaled dot-product attention as one kernel (TbeAttentionFusionPass).

Matches from the Q·Kᵀ matmul to the P·V matmul: ``matmul(softmax(matmul(Q, Kᵀ) * scale + mask), V)``, with
the scale and the mask optional and Kᵀ either any tensor or a ``permute_dims`` taken into the group. When Q,
K and V are parts of one merged projection (MatMulSiblingMergeFusionPass), the slice + reshape (+ permute)
that cut each part into heads is taken into the group as an injective prologue: the DMA into L1 does it, and
the kernel reads the merged projection once instead of three separate tensors written by a second pass. So is
grouped-query attention's repeat of the KV heads (``repeat_kv``) when there are a few query rows (decode).
Otherwise the reshapes/permutes that split heads (BERT, LLaMA exports) stay outside. Without online-softmax
rescaling a tile needs cube_m complete score rows, so the key length must be static and small enough for UB.
"""

from __future__ import annotations

from tvm.relax.dpl import is_op, wildcard

from ..switches import TBE_ATTENTION as SWITCH
from .checks import (dims, float_dtypes, known_shapes, min_rank, op_name, private_intermediates, softmax_axes,
                     static_axes, tensor_type)
from ..tiling import GEMV_MAX_ROWS
from .registry import PatternSpec, declare
from .softmax import masked, scaled
from .working_set import Budget, add_cube_blocks, add_epilogue, clamp


def last_axis_softmax(ctx, target) -> "str | None":
    sm = ctx.annotated_expr["softmax"]
    ndim = len(dims(sm.args[0]))
    if softmax_axes(sm, ndim) != [ndim - 1]:
        return f"softmax axis {int(sm.attrs.axis)} is not the key axis (last)"
    return None


def attention_working_set(ctx, target) -> int:
    """For cube_m query rows: one Q·Kᵀ fractal step, the complete float32 score rows, every elementwise
    value on those rows (scaled, masked, probabilities), one P·V fractal step and one output block."""
    qk, pv = ctx.annotated_expr["qk"], ctx.annotated_expr["pv"]
    q_dtype = tensor_type(qk.args[0]).dtype
    scores = dims(ctx.annotated_expr["softmax"].args[0])    # after the mask's broadcast; last axis static
    s_kv = scores[-1]
    rows = clamp(scores[-2], target.cube_m)
    budget = Budget(target)
    add_cube_blocks(budget, q_dtype, tensor_type(qk.args[1]).dtype, target, "qk")
    budget.add("scores", rows * s_kv, "float32")
    skip = [ctx.value_to_bound_var[qk], ctx.value_to_bound_var[pv]]
    kt = ctx.annotated_expr.get("kt")
    if kt is not None and kt in ctx.value_to_bound_var:
        skip.append(ctx.value_to_bound_var[kt])
    # the head-split prologue (slice / reshape / permute) is address arithmetic of the operand DMA into L1
    skip += [var for var, call in ctx.matched_bindings.items() if op_name(call) in _LAYOUT_OPS]
    add_epilogue(budget, ctx, skip, lambda s: [1] * (len(s) - 2) + [clamp(s[-2], target.cube_m), s[-1]])
    budget.add("softmax.stats", 2 * rows, "float32")
    add_cube_blocks(budget, tensor_type(pv.args[0]).dtype, tensor_type(pv.args[1]).dtype, target, "pv")
    budget.add("out", target.cube_m * target.cube_n, tensor_type(ctx.value_to_bound_var[pv]).dtype)
    return budget.total()


CHECKS = (float_dtypes, known_shapes, min_rank("q", 2, "query"), min_rank("v", 2, "value"), last_axis_softmax,
          static_axes("softmax", softmax_axes, "attention score"), private_intermediates)

VARIANTS = (
    ("scale_mask", lambda s: masked(scaled(s)), 200, "softmax(Q·Kᵀ * scale + mask)·V"),
    ("scale", scaled, 190, "softmax(Q·Kᵀ * scale)·V"),
    ("mask", masked, 190, "softmax(Q·Kᵀ + mask)·V"),
    ("plain", lambda s: s, 180, "softmax(Q·Kᵀ)·V (scale folded into Q or K)"),
)


_LAYOUT_OPS = ("relax.strided_slice", "relax.reshape", "relax.permute_dims", "relax.nn.pad", "relax.expand_dims",
               "relax.broadcast_to")


def head_split(src):
    """One part of a merged projection cut into heads: ``permute_dims(reshape(strided_slice(src)))``, or
    ``reshape(strided_slice(src))`` (K, whose permute is the Kᵀ), or any tensor."""
    part = is_op("relax.strided_slice")(src, varg_default_wildcard=True)
    heads = is_op("relax.reshape")(part, wildcard())
    return is_op("relax.permute_dims")(heads) | heads | wildcard()


def repeat_kv(x):
    """Grouped-query attention's repeat of the KV heads (LLaMA's ``repeat_kv``): ``expand_dims`` ->
    ``broadcast_to`` -> ``reshape`` of K or V. Taken into the group, each query head reads its KV head in
    place; left outside, the repeat writes (heads / kv_heads) copies of the cache to GM for the kernel to read
    (taken for a few query rows only: ``few_query_rows``)."""
    return is_op("relax.reshape")(is_op("relax.broadcast_to")(is_op("relax.expand_dims")(x), wildcard()), wildcard())


def key_padded(x):
    """``x`` padded along the keys (``AttentionKeyPadFusionPass``): the pad is part of the operand's copy into
    L1, as the head split is."""
    return is_op("relax.nn.pad")(x)


def few_query_rows(ctx, target) -> "str | None":
    """A decode step's attention: at most GEMV_MAX_ROWS query rows per head. Only there is GQA's repeat of K
    and V worth taking in: with many query rows the repeat is written once and the attention rule stages each
    head's K and V panel from it (measured faster on a LLaMA-style prefill of 256 tokens than reading the KV
    heads through the repeat's indices)."""
    rows = dims(ctx.annotated_expr["q"])[-2]
    if not isinstance(rows, int) or rows > GEMV_MAX_ROWS:
        return f"{rows} query rows: the repeat of the KV heads stays a kernel of its own"
    return None


def _declare_all() -> None:
    for variant, build, priority, description in VARIANTS:
        # with GQA's repeat of K and V (decode) first, then the plain operands
        for gqa in (True, False):
            q = head_split(wildcard())
            k, v = ((repeat_kv(wildcard()) if gqa else head_split(wildcard())) for _ in range(2))
            kt = is_op("relax.permute_dims")(k)
            qk = is_op("relax.matmul")(q, key_padded(kt) | kt | wildcard())
            sm = is_op("relax.nn.softmax")(build(qk))
            pv = is_op("relax.matmul")(sm, key_padded(v) | v)
            declare(PatternSpec(name=f"ascendfuse.attention.{variant}{'_gqa' if gqa else ''}", switch=SWITCH,
                                pattern=pv,
                                annotations={"q": q, "kt": kt, "v": v, "qk": qk, "softmax": sm, "pv": pv},
                                checks=CHECKS + ((few_query_rows,) if gqa else ()),
                                working_set=attention_working_set, priority=priority + (5 if gqa else 0),
                                description=description + (" with GQA's repeat of K and V, a few query rows"
                                                           if gqa else "")))


_declare_all()
