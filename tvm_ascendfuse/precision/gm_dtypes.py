"""The dtype each kernel argument has in GM on the NPU under a precision plan, for the traffic model.

On the NPU a 16-bit build reads and writes every float tensor in GM in 16 bits, weights included (ATC converts
them once), except what the plan keeps in float32: the outputs of kernels holding a keep-listed op under a
mixed mode, and the model's own inputs and outputs (their dtypes are the signature's). The host build may keep
a few more tensors in float32 (``storage.py``: a kernel accumulating in its output buffer); the NPU model
follows the plan, not the host's limits.
"""

from __future__ import annotations

from tvm import relax

from ..ir import dtype_bytes
from .modes import keeps_fp32


def gm_element_bytes(plan, kernel_ops: dict):
    """A function (relax function, call_tir, argument index) -> bytes per element in GM, or None when the
    plan stores nothing in 16 bits. ``kernel_ops``: kernel name -> its source ops (the report's rows)."""
    dtype = plan.storage_dtype
    if dtype is None:
        return None
    narrow = dtype_bytes(dtype)
    keep = plan.keeps_fp32_ops
    producers: dict = {}

    def producer_map(func):
        key = func.__chandle__() if hasattr(func, "__chandle__") else id(func)
        if key not in producers:
            table, bound = {}, {}
            for block in getattr(func.body, "blocks", []):
                for b in block.bindings:
                    if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call) \
                            and len(b.value.args) == 2 and hasattr(b.value.args[0], "name_hint"):
                        table[b.var] = b.value.args[0].name_hint
                        bound[b.value] = b.var
            outputs = set()
            relax.analysis.post_order_visit(func.body.body, lambda e: outputs.add(e)
                                            if isinstance(e, relax.Var) else None)
            producers[key] = (table, bound, outputs)
        return producers[key]

    def stored_fp32(kernel: str | None) -> bool:
        return keep and kernel is not None and keeps_fp32(kernel_ops.get(kernel)) is not None

    def element_bytes(func, call, index: int, counted_dtype: str) -> int:
        width = dtype_bytes(counted_dtype)
        if counted_dtype != "float32":
            return width
        table, bound, outputs = producer_map(func)
        args = list(call.args[1].fields) if isinstance(call.args[1], relax.Tuple) else [call.args[1]]
        kernel = call.args[0].name_hint
        if index >= len(args):            # the kernel's output
            return width if stored_fp32(kernel) or bound.get(call) in outputs else narrow
        arg = args[index]
        if isinstance(arg, relax.Var) and (arg in func.params or arg in outputs):
            return width                  # the model's own inputs and outputs keep their dtype
        if isinstance(arg, relax.Var) and stored_fp32(table.get(arg)):
            return width
        return narrow

    return element_bytes
