"""FoldConstant on high-level Relax, guarded against a TVM 0.27 bug.

Before legalization, TVM's FoldConstant runs an op's legalizer to see whether the call folds. For
``dynamic_strided_slice`` (ONNX Slice with starts/ends as inputs) the legalizer emits a ``call_tir(shape_func)``
binding into the function but the PrimFunc never reaches the module, so the build later fails with
"There is no definition of I.GlobalVar("shape_func")". TVM's default pipeline only folds after LegalizeOps,
where this cannot happen. Here the folded module is kept only if it is well formed; otherwise the unfolded one
goes on (the FoldConstant after LegalizeOps folds what is left).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..passbase import PyPass


def is_well_formed(mod: tvm.IRModule) -> bool:
    try:
        return bool(relax.analysis.check_well_formed(mod))   # well_formed() returns None (raises on error)
    except Exception:   # 0.27 raises for an undefined GlobalVar instead of returning False
        return False


class SafeFoldConstant(PyPass):
    def pass_name(self) -> str:
        return "AscendSafeFoldConstant"

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        folded = relax.transform.FoldConstant()(mod)
        return folded if folded.same_as(mod) or is_well_formed(folded) else mod
