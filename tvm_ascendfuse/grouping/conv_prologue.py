"""A conv's input prologue: what the grouping may put in front of a conv2d's data operand.

The conv2d schedule stages its input per task (the padded input rows of a block of output rows, or the input
re-laid out for the register blocks); ops that compute each staged element from the same element of their
inputs and from per-channel values can run while staging, so their result never goes to GM:

* per-channel affine maps and activations: DenseNet's pre-activation ``BN -> ReLU`` in front of a 1x1 conv
  (the BN as ``x * s + t``, see ``BatchnormScaleFusionPass``), SE's channel-wise ``x * gate`` in front of the
  projection conv (which the conv rules then move onto the weight, ``schedule/gated_weight.py``);
* injective ops (concat, channel slice, reshape): the conv reads the concat's parts where they are.

Accepted in front of a conv's data operand (``prologue_op``): injective ops, and elementwise/broadcast ops
whose operands are at most one tensor of the output's shape plus tensors that vary only along N and C
(per-channel or per-(sample, channel) values: ``(1, C, 1, 1)``, ``(N, C, 1, 1)``, ``(C, 1, 1)``, scalars).
Two full-size operands (a residual add) belong in the producer's epilogue, where the conv+bias+residual
patterns put them, and are refused here. Only plain convs (groups 1, NCHW/OIHW) are recognised
(``conv_data_position``); other cube ops keep the rule that only injective ops may feed their operands.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir import expr as iexpr
from tvm.s_tir import stmt as sstmt

from ..ir import dims

ELEMWISE, BROADCAST, INJECTIVE = 0, 1, 2


def conv_data_position(prim: tirx.PrimFunc) -> int | None:
    """Parameter position of the data operand when ``prim``'s one reduction block is an NCHW conv2d with
    groups 1 (``C[n, f, y, x] += D[n, rc, ..] * W[f, rc, ry, rx]``, D read directly or through its padding
    block), else None."""
    params = [p for p in prim.params if isinstance(getattr(p, "ty", None), tirx.BufferType)]
    blocks: list = []
    tvm_ffi.structural_walk(prim.body, (sstmt.SBlock, blocks.append))
    reductions = [b for b in blocks if any(iv.iter_type != tirx.IterVar.DataPar for iv in b.iter_vars)]
    if len(reductions) != 1:
        return None
    block = reductions[0]
    kinds = [iv.iter_type == tirx.IterVar.DataPar for iv in block.iter_vars]
    body = block.body
    if kinds != [True] * 4 + [False] * 3 or block.init is None or not isinstance(body, tirx.BufferStore):
        return None
    n, f, _, _, rc, ry, rx = (iv.var for iv in block.iter_vars)
    loads: list = []
    tvm_ffi.structural_walk(body.value, (iexpr.TensorLoad, loads.append))
    same = lambda idx, vs: len(idx) == len(vs) and all(  # noqa: E731
        isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(idx, vs))
    weight = next((ld for ld in loads if same(ld.indices, [f, rc, ry, rx])), None)
    data = next((ld for ld in loads if ld is not weight and len(ld.indices) == 4 and same(ld.indices[:2], [n, rc])),
                None)
    if weight is None or data is None:
        return None
    source = data.source
    if not any(source.same_as(p) for p in params):
        # read through its padding block: the block writing ``source`` reads one parameter
        writer = next((b for b in blocks if any(w.source.same_as(source) for w in b.writes)), None)
        reads = [r.source for r in writer.reads] if writer is not None else []
        srcs = [p for p in params if any(r.same_as(p) for r in reads)]
        if len(srcs) != 1:
            return None
        source = srcs[0]
    return next(i for i, p in enumerate(params) if p.same_as(source))


def is_concat(prim: tirx.PrimFunc) -> bool:
    """``prim`` is one block that writes each element from one of several parameters, chosen by an
    ``if_then_else`` on the output index (a legalized concatenate)."""
    blocks: list = []
    tvm_ffi.structural_walk(prim.body, (sstmt.SBlock, blocks.append))
    inner = [b for b in blocks if b.name_hint != "root"]
    if len(inner) != 1 or not isinstance(inner[0].body, tirx.BufferStore):
        return False
    value = inner[0].body.value
    if not (isinstance(value, tvm.ir.expr.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "prim.if_then_else"):
        return False
    sources = {str(r.source.name) for r in inner[0].reads}
    return len(sources) >= 2


def shape_key(expr) -> list | None:
    """A tensor expression's shape as comparable values (ints; symbolic dims by their text), None when it
    has no known rank."""
    values = dims(expr) if isinstance(getattr(expr, "ty", None), relax.TensorType) else None
    if values is None:
        return None
    return [d if isinstance(d, int) else str(d) for d in values]


def prologue_op(node) -> str | None:
    """None when ``node`` may run in a conv's input prologue, else why not (see the module docstring)."""
    if node.pattern == INJECTIVE:
        return None
    if node.pattern not in (ELEMWISE, BROADCAST):
        return "compute fused into a conv's input is not elementwise"
    out_shape = shape_key(node.var)
    if out_shape is None or len(out_shape) != 4:
        return "prologue op is not on an NCHW tensor"
    full = set()
    for arg in node.args:
        shape = shape_key(arg)
        if shape is None:
            return "prologue operand of unknown shape"
        padded = [1] * (4 - len(shape)) + list(shape)
        if len(padded) != 4:
            return "prologue operand of higher rank"
        if padded == list(out_shape):
            full.add(arg)
        elif padded[2] != 1 or padded[3] != 1 or padded[0] not in (1, out_shape[0]) \
                or padded[1] not in (1, out_shape[1]):
            return f"prologue operand {shape} varies along H or W"
    if len(full) > 1:
        return "prologue op with two full-size operands (an epilogue of their producer)"
    return None
