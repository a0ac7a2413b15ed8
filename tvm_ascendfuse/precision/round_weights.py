"""RoundWeightsPass: under a mode that converts a float32 model to 16 bits, GEMM and conv weights take the
values they have in 16 bits.

On the NPU such a model's weights are converted to fp16/bf16 once (ATC does it when it builds the model); the
host keeps them as float32 values (its kernels multiply in float32 vectors, and a weight that a rule prepacks
is read from cache), but rounded, so a build's numbers are the ones the NPU would compute. Only the weight
operand of matmul / conv is rounded: other constants (attention masks of -1e9, norm epsilons, LayerNorm's
gamma that mixed precision keeps in float32) keep their float32 values.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..passbase import PyPass
from ..report import FusionReport
from .modes import MODES, SIXTEEN_BIT

PASS_NAME = "RoundWeights"
WEIGHT_OPS = ("relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.nn.conv2d_transpose")


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 ``values`` rounded to ``dtype`` (float16, or bfloat16 by round-to-nearest-even on the upper
    16 bits) and returned as float32."""
    values = np.asarray(values, dtype=np.float32)
    if dtype == "float16":
        return values.astype(np.float16).astype(np.float32)
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(values), out, values).astype(np.float32)


class RoundWeightsPass(PyPass):
    def __init__(self, report: FusionReport, plan):
        self.report = report
        self.plan = plan

    def pass_name(self) -> str:
        return PASS_NAME

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        dtype = MODES[self.plan.mode][0]
        if dtype not in SIXTEEN_BIT:
            return mod
        rounded = {"count": 0, "bytes": 0}

        def on_call(call):
            if not isinstance(call.op, tvm.ir.Op) or call.op.name not in WEIGHT_OPS or len(call.args) < 2:
                return call
            w = call.args[1]
            if not isinstance(w, tvm.ir.GenericConst) or str(w.ty.dtype) != "float32":
                return call
            value = w.value.numpy()
            rounded["count"] += 1
            rounded["bytes"] += value.nbytes
            new = relax.const(round_to(value, dtype), "float32")
            return relax.Call(call.op, [call.args[0], new, *call.args[2:]], call.attrs, call.ty_args)

        import tvm_ffi

        out = {}
        for gv, func in mod.functions.items():
            if isinstance(func, relax.Function):
                out[gv] = tvm_ffi.structural_map(func, (relax.Call, on_call))
        if not rounded["count"]:
            return mod
        self.report.record(PASS_NAME, True, where=dtype, weights=rounded["count"], bytes=rounded["bytes"])
        new = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        for gv, func in out.items():
            new[gv] = func
        return new
