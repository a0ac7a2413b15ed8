"""A widening conversion in front of a cube operand: what a model stored in 16 bits starts with.

A model in fp16/bf16 is computed in float32 (``precision/compute_fp32.py``): each 16-bit input is converted
on entry (``x = astype(x16, float32)``) and the first GEMM, attention or conv reads ``x``. Alone, that
conversion is a kernel of its own, writing the whole input to GM in float32 for the next kernel to read back.
In front of a cube operand it is the conversion the NPU's DMA does as it moves the operand into L1 (fp16 ->
fp32 on the way in), and on the host it is done where the rule stages the operand (its packing or vector
loads), once per element: so it joins the operand's group like a layout op.

Accepted (``widening_cast``): a one-block elementwise kernel whose every store is a float32 conversion of a
load of its one 16-bit float input at the same index. Narrowing or integer casts are computations (they round)
and keep the rule that only layout ops feed a cube operand.
"""

from __future__ import annotations

import tvm_ffi
from tvm import tirx
from tvm.ir import expr as iexpr
from tvm.s_tir import stmt as sstmt

SIXTEEN_BIT_FLOATS = ("float16", "bfloat16")


def widening_cast(prim: tirx.PrimFunc) -> bool:
    """Whether ``prim`` only converts its one 16-bit float parameter to a float32 output of the same shape,
    element by element (see the module docstring)."""
    params = [p for p in prim.params if isinstance(getattr(p, "ty", None), tirx.BufferType)]
    if len(params) != 2:
        return False
    src, dst = params
    if str(src.ty.dtype) not in SIXTEEN_BIT_FLOATS or str(dst.ty.dtype) != "float32":
        return False
    if len(src.ty.shape) != len(dst.ty.shape) or any(
            str(a) != str(b) for a, b in zip(src.ty.shape, dst.ty.shape)):
        return False
    blocks: list = []
    tvm_ffi.structural_walk(prim.body, (sstmt.SBlock, blocks.append))
    inner = [b for b in blocks if b.name_hint != "root"]
    if len(inner) != 1 or not isinstance(inner[0].body, tirx.BufferStore):
        return False
    store = inner[0].body
    value = store.value
    if not (store.buffer.same_as(dst) and isinstance(value, tirx.Cast) and _dtype(value) == "float32"):
        return False
    load = value.value
    return isinstance(load, iexpr.TensorLoad) and load.source.same_as(src) and len(load.indices) == len(
        store.indices) and all(i.same_as(j) for i, j in zip(load.indices, store.indices))


def _dtype(expr) -> str:
    ty = getattr(expr, "ty", None)
    return str(ty.dtype) if ty is not None and hasattr(ty, "dtype") else str(getattr(expr, "dtype", ""))
