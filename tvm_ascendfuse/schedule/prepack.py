"""PrepackConstantWeights: run the weight re-layouts that schedules requested once, at compile time.

A GEMM/conv schedule re-lays out a constant weight through a copy block annotated
``meta_schedule.layout_rewrite_preproc`` (``layout.py``). This pass moves those blocks into their own
PrimFuncs called on the weights (``relax.transform.SplitLayoutRewritePreproc``), evaluates the calls whose
weight is a constant (``FoldConstant``), and drops the packing PrimFuncs nobody calls any more. A weight
that is not a constant (a model parameter passed at run time) keeps its packing call, run per inference:
still exact. Modules without such blocks are returned unchanged (TVM's split pass asserts on PrimFuncs it
cannot read, so it is not run needlessly).

Pipeline position: ``AttachAttrLayoutFreeBuffers`` -> ApplyUBSchedules -> PrepackConstantWeights ->
(UB verification, lowering).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from ..passbase import PyPass
from .layout import PREPROC_ANNOTATION


def has_prepack_blocks(mod: tvm.IRModule) -> bool:
    found = []

    def visit(block):
        if PREPROC_ANNOTATION in block.annotations:
            found.append(block)

    for _, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            tvm_ffi.structural_walk(func, (s_tir.SBlock, visit))
            if found:
                return True
    return False


class PrepackConstantWeights(PyPass):
    def __init__(self, fold=None):
        self.fold = fold    # a FoldConstant-like pass; default relax.transform.FoldConstant()

    def pass_name(self) -> str:
        return "AscendPrepackConstantWeights"

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        if not has_prepack_blocks(mod):
            return mod
        fold = self.fold if self.fold is not None else relax.transform.FoldConstant()
        return tvm.transform.Sequential([relax.transform.SplitLayoutRewritePreproc(), fold,
                                         relax.transform.DeadCodeElimination()])(mod)
