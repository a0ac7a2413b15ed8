"""The dtype a kernel's float32 tiles have on the NPU's chip under a precision plan, for the capacity checks.

The host computes a 16-bit build in float32 (``compute_fp32.py``), so every tensor the grouping and the
schedule rules see is float32; on the NPU the same kernel holds its UB/L1 tiles in the plan's 16-bit dtype
(the cube accumulates in float32 in L0C). Counted in float32 bytes, a 16-bit kernel would get the tiles of a
float32 one, half of what fits. So:

* ``MarkOnChipDtype`` (after FuseTIR) marks each kernel whose tensors the plan stores in 16 bits with the
  PrimFunc attribute ``ON_CHIP_FLOAT`` (its 16-bit dtype); a kernel the plan computes partly in float32 (any
  keep-listed op under a mixed mode: a softmax inside an attention kernel holds float32 score rows on chip
  even where its output is 16-bit) or that precision repair kept gets none;
* ``kernel_target`` gives the schedule rules, for one kernel, the target whose ``float_bytes`` is that
  dtype's, and ``analysis/ub_usage.py`` counts the kernel's float32 allocations with it (the verification);
* ``grouping_target`` gives the grouping the same when the plan keeps no op in float32 (a force mode); under a
  mixed mode it counts float32 (a group it accepts then always fits when scheduled).
"""

from __future__ import annotations

import dataclasses

from ..ir import dtype_bytes
from ..passbase import PyPass
from .modes import FP32_KEEP

ON_CHIP_FLOAT = "ascendfuse.on_chip_float"
PASS_NAME = "MarkOnChipDtype"


def _with_float(target, dtype):
    nbytes = dtype_bytes(dtype) if dtype else 4
    return target if nbytes == target.float_bytes else dataclasses.replace(target, float_bytes=nbytes)


def on_chip_float(func) -> str | None:
    """The 16-bit dtype a kernel's float32 tiles have on the NPU (its ``ON_CHIP_FLOAT`` mark), or None."""
    attrs = getattr(func, "attrs", None)
    return str(attrs[ON_CHIP_FLOAT]) if attrs is not None and ON_CHIP_FLOAT in attrs else None


def kernel_target(target, func):
    """``target`` as the schedule rules size one kernel's tiles with: float32 counted in the mark's bytes;
    ``target`` itself for a kernel without a mark."""
    dtype = on_chip_float(func)
    return target if dtype is None else _with_float(target, dtype)


def grouping_target(target, plan):
    """``target`` as the grouping counts a group's tile with under ``plan`` (see the module docstring)."""
    if plan is None or plan.storage_dtype is None or plan.keeps_fp32_ops:
        return target
    return _with_float(target, plan.storage_dtype)


class MarkOnChipDtype(PyPass):
    """Marks the kernels the plan stores in 16 bits (``ON_CHIP_FLOAT``); the report's kernel rows get
    ``on_chip_dtype``. Nothing happens for a float32 build."""

    def __init__(self, report, plan):
        self.report, self.plan = report, plan

    def pass_name(self) -> str:
        return PASS_NAME

    def transform_module(self, mod):
        from tvm import tirx

        dtype = self.plan.storage_dtype
        if dtype is None:
            return mod
        rows = {r["name"]: r for r in self.report.kernels}
        updates = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            row = rows.get(gv.name_hint, {})
            if gv.name_hint in self.plan.keep_kernels or (
                    self.plan.keeps_fp32_ops and any(str(op).split(".")[-1] in FP32_KEEP for op in row.get("ops") or ())):
                continue
            updates[gv] = func.with_attr(ON_CHIP_FLOAT, dtype)
            if row:
                row["on_chip_dtype"] = dtype
        if not updates:
            return mod
        from tvm import IRModule

        mod = IRModule(dict(mod.functions), attrs=mod.attrs)
        for gv, func in updates.items():
            mod[gv] = func
        return mod
