"""Float32ComputePass: a model stored in 16-bit floats computed in float32.

Rewrites every 16-bit float tensor of a Relax function to float32::

    y16 = conv2d(x16, W16)            ->   x = astype(x16, f32); y = conv2d(x, W)  (W converted once, here)
    return y16                        ->   return astype(y, f16)

Why: the host has no 16-bit arithmetic (Zen 5 has F16C conversions and AVX512-BF16 dot products, but no
AVX512-FP16). LLVM promotes every fp16 operation to float and back one scalar at a time, and an fp16 conv
accumulates in fp16: FP16 ResNet-50 ran 7x ONNX Runtime with every kernel at ~60 GFLOP/s. Computed in float32,
every fusion pattern, grouping decision and schedule rule applies unchanged (they were written and tuned on
float32 graphs), and accumulators are float32 as on the NPU's cube unit. 16-bit storage between kernels is put
back after scheduling (``storage.SixteenBitStoragePass``), where the kernel boundaries are known: each kernel
then loads 16-bit values, converts them in vector registers and stores its result in 16 bits.

Constants (weights) are converted here once: a 16-bit weight is exactly representable in float32, so the
float32 graph computes the same products. Casts to a 16-bit type inside the model become casts to float32
(the value is not rounded there; ``SixteenBitStoragePass`` rounds at kernel boundaries). The function's
signature stays as it was: 16-bit inputs are converted on entry, 16-bit outputs converted back on exit. The
function is marked with the 16-bit dtype (``ir.STORED_FLOAT_ATTR``): its constants keep that dtype's rounding
(an fp16 export's 1/sqrt(2) is 0.70703), and the graph rewrites that recognise ops by their constants (GELU)
compare them with that dtype's tolerance (an fp16 BERT's GELU otherwise stayed erf and five elementwise ops,
and its kernels differed from the float32 model's).

A call that declares its own result types (call_tir of a PrimFunc the importer typed: Pad, Tile, Flip, einsum in
16 bits) runs on the operand types it was written for, its operands rounded back to the 16-bit types they have
in the model, and a 16-bit result is widened; only that call computes in 16 bits. Clip's PrimFuncs become ops
first (``clamp_calls.py``): left to this path they kept casts inside the conv kernels and put the ReLU6 ones on
the fallback rule (an fp16 MobileNetV2: 46 kernels, some on fallback, 6.1 ms, where the ops give 54 kernels on
the conv rules and 4.2 ms).

Refused (function left as it is, reason in the report): a binding that is not a plain ``var = expr``
(match_cast), a call declaring a tuple of results with 16-bit fields, calls of other Relax functions.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..ir import STORED_FLOAT_ATTR
from ..passbase import PyPass
from ..report import FusionReport
from .functions import dtype_of, sixteen_bit_functions, with_functions
from .modes import SIXTEEN_BIT

PASS_NAME = "Float32Compute"


class Float32ComputePass(PyPass):
    """See the module docstring. ``plan`` (a ``PrecisionPlan``) records which 16-bit type the model stored
    its tensors in, for the storage pass after scheduling."""

    def __init__(self, report: FusionReport, plan):
        self.report = report
        self.plan = plan

    def pass_name(self) -> str:
        return PASS_NAME

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        updates = {}
        for gv, func, found in sixteen_bit_functions(mod):
            reason = _refusal(func)
            if reason is not None:
                self.report.record(PASS_NAME, False, reason, where=gv.name_hint)
                continue
            new = _Widen().function(func, gv.name_hint)
            if len(found) == 1:
                # the constants keep their 16-bit rounding: graph rewrites compare them with its tolerance
                new = new.with_attr(STORED_FLOAT_ATTR, next(iter(found)))
            updates[gv] = new
            self.plan.model_dtypes |= found
            self.report.record(PASS_NAME, True, where=gv.name_hint, dtypes=sorted(found))
        return with_functions(mod, updates)


def _refusal(func: relax.Function) -> str | None:
    if not isinstance(func.body, relax.SeqExpr):
        return "function body is not a sequence of bindings"
    for block in func.body.blocks:
        for b in block.bindings:
            if not isinstance(b, relax.VarBinding):
                return f"binding of '{b.var.name}' is a match_cast"
    problem = []

    def visit(e):
        if problem or not isinstance(e, relax.Call):
            return
        if isinstance(e.op, relax.GlobalVar):
            problem.append(f"calls the function '{e.op.name_hint}'")
        elif e.ty_args and isinstance(e.ty_args[0], relax.TupleType) and _has_sixteen_bit(e.ty_args[0]):
            problem.append(f"'{e.op.name}' declares a tuple of results with 16-bit fields")

    relax.analysis.post_order_visit(func.body, visit)
    return problem[0] if problem else None


def _has_sixteen_bit(ty) -> bool:
    if isinstance(ty, relax.TensorType):
        return str(ty.dtype) in SIXTEEN_BIT
    if isinstance(ty, relax.TupleType):
        return any(_has_sixteen_bit(f) for f in ty.fields)
    return False


def _float32_constant(const):
    value = const.value.numpy()
    return relax.const(np.asarray(value, dtype=np.float32), "float32")


def _with_float32_attrs(attrs):
    """The op's attributes with every 16-bit dtype field (out_dtype, dtype) made float32, or None if none."""
    if attrs is None or not hasattr(type(attrs), "__tvm_ffi_type_info__"):
        return None
    info = type(attrs).__tvm_ffi_type_info__
    values = {f.name: getattr(attrs, f.name) for f in info.fields}
    changed = {k for k, v in values.items() if k in ("dtype", "out_dtype") and str(v) in SIXTEEN_BIT}
    if not changed:
        return None
    values.update({k: "float32" for k in changed})
    return tvm.ir.make_node(info.type_key, **values)


class _Widen:
    """Rebuilds one function binding by binding with a BlockBuilder (dtypes re-inferred on the way)."""

    def __init__(self):
        self.remap = {}

    def function(self, func: relax.Function, name: str) -> relax.Function:
        bb = self.bb = relax.BlockBuilder()
        params = list(func.params)
        with bb.function(name, params, attrs=dict(func.attrs) if func.attrs else None, private=False):
            with bb.dataflow():
                for p in params:
                    if dtype_of(p) in SIXTEEN_BIT:
                        self.remap[p] = bb.emit(relax.op.astype(p, "float32"), name_hint=f"{p.name}_f32")
                for block in func.body.blocks:
                    for b in block.bindings:
                        self.remap[b.var] = bb.emit(self.expr(b.value), name_hint=b.var.name)
                out = self.expr(func.body.body)
                out = bb.emit_output(_back_to(out, func.body.body.ty))
            bb.emit_func_output(out)
        new = bb.get()[name]
        return new.with_attrs(func.attrs) if func.attrs else new

    def expr(self, e):
        if isinstance(e, relax.Var):
            return self.remap.get(e, e)
        if isinstance(e, tvm.ir.GenericConst):
            return _float32_constant(e) if dtype_of(e) in SIXTEEN_BIT else e
        if isinstance(e, relax.Tuple):
            return relax.Tuple([self.expr(f) for f in e.fields])
        if isinstance(e, relax.TupleGetItem):
            return relax.TupleGetItem(self.expr(e.tuple_value), e.index)
        if isinstance(e, relax.Call):
            args = [self.expr(a) for a in e.args]
            if isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.astype":
                dtype = str(e.attrs.dtype)
                dtype = "float32" if dtype in SIXTEEN_BIT else dtype
                if dtype_of(args[0]) == dtype:
                    return args[0]
                return relax.op.astype(args[0], dtype)
            if e.ty_args:
                return self.kept(e, args)
            attrs = _with_float32_attrs(e.attrs)
            return relax.Call(e.op, args, attrs if attrs is not None else e.attrs, e.ty_args)
        return e


    def kept(self, e: relax.Call, args):
        """A call that declares its own result types (call_tir of a PrimFunc the importer typed: Pad, Tile,
        Flip, einsum in 16 bits) runs on the operand types it was written for: widened operands are rounded
        back to their 16-bit types (the rounding the model's tensors have there) and a 16-bit result is
        widened. Only the call itself computes in 16 bits, not the whole function."""
        def narrow(new, old):
            if isinstance(old, relax.Tuple):
                return relax.Tuple([narrow(n, o) for n, o in zip(new.fields, old.fields)])
            want = dtype_of(old)
            if want in SIXTEEN_BIT and dtype_of(new) != want:
                return self.bb.emit(relax.op.astype(new, want))
            return new

        call = relax.Call(e.op, [narrow(n, o) for n, o in zip(args, e.args)], e.attrs, e.ty_args)
        if _has_sixteen_bit(e.ty_args[0]):        # a tensor: tuples of 16-bit results were refused
            return relax.op.astype(self.bb.emit(call), "float32")
        return call


def _back_to(out, ty):
    """The function's result in the dtypes of its original signature."""
    if isinstance(ty, relax.TensorType) and str(ty.dtype) in SIXTEEN_BIT and dtype_of(out) != str(ty.dtype):
        return relax.op.astype(out, str(ty.dtype))
    if isinstance(ty, relax.TupleType) and isinstance(out, relax.Tuple):
        return relax.Tuple([_back_to(f, t) for f, t in zip(out.fields, ty.fields)])
    if isinstance(ty, relax.TupleType) and any(_has_sixteen_bit(t) for t in ty.fields):
        return relax.Tuple([_back_to(relax.TupleGetItem(out, i), t) for i, t in enumerate(ty.fields)])
    return out
