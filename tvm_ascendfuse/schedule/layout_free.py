"""MarkConstantWeights: tell each kernel which of its inputs are compile-time constants.

Sets the PrimFunc attr ``layout_free_buffers`` (the parameter indices the GEMM/conv rules may re-lay out,
see ``layout.py``) to the arguments that are Relax constants at *every* call site of the kernel, so a
kernel shared by a constant-weight call and a run-time-weight call is not packed. Unlike TVM's
``AttachAttrLayoutFreeBuffers`` it keeps kernel names (that pass re-adds every PrimFunc, renaming it
``<name>1``, which breaks the per-kernel report) and does not treat model parameters (``num_input``) as
constants: here weights are constants after ONNX import.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from ..passbase import PyPass
from .layout import LAYOUT_FREE_ATTR

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def constant_args_per_kernel(mod: tvm.IRModule) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.same_as(_CALL_TIR):
            name = expr.args[0].name_hint
            args = expr.args[1].fields if isinstance(expr.args[1], relax.Tuple) else []
            const = {i for i, a in enumerate(args) if isinstance(a, tvm.ir.GenericConst)}
            found[name] = found[name] & const if name in found else const

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return found


class MarkConstantWeights(PyPass):
    def pass_name(self) -> str:
        return "AscendMarkConstantWeights"

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        consts = constant_args_per_kernel(mod)
        for gv, func in list(mod.functions.items()):
            if isinstance(func, tirx.PrimFunc) and consts.get(gv.name_hint):
                mod[gv] = func.with_attr(LAYOUT_FREE_ATTR, sorted(consts[gv.name_hint]))
        return mod
