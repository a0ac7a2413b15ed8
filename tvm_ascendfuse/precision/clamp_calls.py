"""ClampCallsAsOpsPass: the ONNX importer's clamp PrimFuncs in a 16-bit model become Relax's maximum/minimum.

TVM's ONNX importer emits Clip as ``call_tir(maximum, (x, lo))`` and ``call_tir(minimum, (.., hi))``
(``emit_te(topi.maximum)``), PrimFuncs typed in the model's dtype. ``Float32ComputePass`` cannot widen a call
that declares its own 16-bit result type, so one Clip left a whole fp16 model computing in fp16: every conv
accumulated in fp16, and an fp16 MobileNetV2 (ReLU6 = Clip) came out 3.9% of its output's scale away from the
float32 computation with its fp16 weights, where ONNX Runtime's fp16 run is 0.03% away.

Each such call whose PrimFunc is one elementwise ``max``/``min`` of its tensor arguments (or of its first
argument and a constant, opset 6's attribute form, where topi widens an fp16 ``x`` to the float32 bound and
the importer types the call float32: TVM's own FuseTIR then failed on the mixed types) becomes
``R.maximum`` / ``R.minimum`` of the same operands (``x`` converted as the PrimFunc converts it),
which the widening pass converts like any other op; the fusion patterns already take both forms of ReLU6 and
clamps. ``Float32ComputePass`` alone would now keep such a call in 16 bits with the right numbers, but the
casts around it split the conv + ReLU6 kernels (measured in ``compute_fp32.py``'s docstring). Functions
without 16-bit tensors are left as they are (their kernels stay the ones measured).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx

from ..passbase import PyPass
from ..report import FusionReport
from .functions import sixteen_bit_functions, with_functions

PASS_NAME = "ClampCallsAsOps"


def clamp_of(prim: tirx.PrimFunc):
    """("maximum" | "minimum", operands) when ``prim`` stores one ``max``/``min`` per output element, each
    operand the index of the parameter it loads (possibly converted to the output's dtype) or a float
    constant; else None."""
    stores, loads = [], []
    tvm_ffi.structural_walk(prim.body, [(tirx.BufferStore, stores.append)])
    if len(stores) != 1 or len(prim.params) < 2:
        return None
    store = stores[0]
    value = store.value
    kind = {tirx.Max: "maximum", tirx.Min: "minimum"}.get(type(value))
    buffers = list(prim.params)    # TVM 0.27: a PrimFunc's parameters are its buffers
    if kind is None or not store.buffer.same_as(buffers[-1]):
        return None
    operands = []
    for operand in (value.a, value.b):
        if isinstance(operand, tirx.FloatImm):
            operands.append(float(operand.value))
            continue
        if isinstance(operand, tirx.Cast) and str(operand.ty.dtype) == str(store.buffer.dtype):
            operand = operand.value      # opset 6's bounds on fp16: topi widens x to the float bound's type
        loads.clear()
        tvm_ffi.structural_walk(operand, [(tvm.ir.expr.TensorLoad, loads.append)])
        if not isinstance(operand, tvm.ir.expr.TensorLoad) or len(loads) != 1:
            return None
        index = next((i for i, b in enumerate(buffers[:-1]) if b.same_as(operand.source)), None)
        if index is None:
            return None
        operands.append(index)
    if not any(isinstance(o, int) for o in operands):
        return None
    return kind, operands


class ClampCallsAsOpsPass(PyPass):
    def __init__(self, report: FusionReport):
        self.report = report

    def pass_name(self) -> str:
        return PASS_NAME

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        updates = {}
        for gv, func, _ in sixteen_bit_functions(mod):
            rewriter = _Rewriter(mod)
            new = rewriter.visit_expr(func)
            if rewriter.count:
                updates[gv] = new
                self.report.record(PASS_NAME, True, where=gv.name_hint, calls=rewriter.count)
        return relax.transform.DeadCodeElimination()(with_functions(mod, updates)) if updates else mod


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.mod_ = mod
        self.count = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir"):
            return call
        callee, args = call.args[0], call.args[1]
        if not isinstance(callee, relax.GlobalVar) or not isinstance(args, relax.Tuple):
            return call
        prim = self.mod_[callee]
        found = clamp_of(prim) if isinstance(prim, tirx.PrimFunc) else None
        out = call.ty_args[0] if call.ty_args else None
        if found is None or not isinstance(out, relax.TensorType):
            return call
        kind, operands = found
        dtype = str(out.dtype)
        exprs = [self.widened(args.fields[o], dtype) if isinstance(o, int) else relax.const(o, dtype)
                 for o in operands]
        if any(e is None for e in exprs):
            return call
        op = relax.op.maximum if kind == "maximum" else relax.op.minimum
        new = op(*exprs)
        # the op's result must be the call's: same dtype and shape (a bound broadcast over x, never x over it)
        inferred = self.builder_.normalize(new).ty
        if str(inferred.dtype) != dtype or not tvm_ffi.structural_equal(inferred.shape, out.shape):
            return call
        self.count += 1
        return new

    @staticmethod
    def widened(arg, dtype: str):
        """``arg`` in the call's result dtype: as it is, or converted to a wider float (the PrimFunc's own
        conversion); None for any other change of type."""
        have = arg.ty.dtype if isinstance(arg.ty, relax.TensorType) else None
        if have is None or str(have) == dtype:
            return arg
        src, dst = tvm.DataType(str(have)), tvm.DataType(dtype)
        if src.type_code != dst.type_code or src.bits > dst.bits:
            return None
        return relax.op.astype(arg, dtype)
