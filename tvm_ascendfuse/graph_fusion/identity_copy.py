"""IdentityCopyFusionPass: a kernel call that copies its one input unchanged is that input.

Rewrites::

    y = call_tir(f, (x,))   ->   y = x      when f computes  out[i...] = x[i...]  over the same shape

Why: ONNX ``Pad`` whose pads depend on the input's shape (Swin Transformer pads every window stage to a
multiple of the window size) is imported as a ``call_tir`` of TVM's pad; once the shapes are static, a pad
by zero on every side is a plain copy. Kept, it is a copy the grouping fuses after the producer, and the
producer's rule may not take a kernel that ends in it (Swin-T's ``matmul + residual + LayerNorm`` followed
by a pad by zero fell to the fallback rule). Exact: the value is the input, element for element.

Recognised on the callee itself, not on the op that made it: one compute block over exactly the output's
shape, storing at its own iterators the input read at the same iterators (after simplifying with the
iterators' ranges, so a pad whose bounds test always holds counts too), input and output of one shape and
dtype. Anything else (a real pad, a cast, a transpose, a second input) is left alone.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from ..fusion_pass import FusionPass
from ..switches import IDENTITY_COPY as NAME
from ._graph import FunctionGraph, Rewire, static_shape


class IdentityCopyFusionPass(FusionPass):
    """See the module docstring."""

    switch_name = NAME

    def transform_function(self, func, mod):
        graph = FunctionGraph.of(func)
        alias = {}
        for var in graph.order:
            call = graph.call(var, "relax.call_tir")
            if call is None or len(call.args) != 2 or not isinstance(call.args[0], tvm.ir.GlobalVar):
                continue
            args = call.args[1]
            if not isinstance(args, relax.Tuple) or len(args.fields) != 1:
                continue
            src = args.fields[0]
            callee = mod.functions.get(call.args[0])
            if not isinstance(callee, tirx.PrimFunc) or not _same_tensor_type(src, var):
                continue
            if is_identity_copy(callee) and self.take(var.name, kernel=call.args[0].name_hint):
                alias[var] = src
        if not alias:
            return func
        return Rewire(alias).visit_expr(func)


def _same_tensor_type(a, b) -> bool:
    shape = static_shape(a)
    return shape is not None and shape == static_shape(b) and str(a.ty.dtype) == str(b.ty.dtype)


def is_identity_copy(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` (two buffers: input, output) writes every output element as the input element at the
    same index, and does nothing else."""
    if func.attrs is not None and "tirx.is_scheduled" in func.attrs:
        return False
    params = [p for p in func.params if isinstance(getattr(p, "ty", None), tirx.BufferType)]
    if len(params) != 2 or len(func.params) != 2:
        return False
    src, dst = params
    if str(src.ty.dtype) != str(dst.ty.dtype) or len(src.ty.shape) != len(dst.ty.shape):
        return False
    shape = []
    for a, b in zip(src.ty.shape, dst.ty.shape):
        if not (isinstance(a, tirx.IntImm) and isinstance(b, tirx.IntImm) and int(a) == int(b)):
            return False
        shape.append(int(a))
    realizes = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlockRealize, realizes.append))
    blocks = [r for r in realizes if r.block.name_hint != "root"]
    if len(blocks) != 1:
        return False
    realize = blocks[0]
    block = realize.block
    if not (isinstance(realize.predicate, tirx.IntImm) and int(realize.predicate) == 1):
        return False
    store = block.body
    if block.init is not None or not isinstance(store, tirx.BufferStore) or not store.buffer.same_as(dst):
        return False
    ivs = list(block.iter_vars)
    if len(ivs) != len(shape) or any(iv.iter_type != tirx.IterVar.DataPar for iv in ivs):
        return False
    ana = tvm.sym.Analyzer()
    for iv, n in zip(ivs, shape):
        dom = iv.dom
        if not (isinstance(dom.min, tirx.IntImm) and int(dom.min) == 0 and isinstance(dom.extent, tirx.IntImm)
                and int(dom.extent) == n):
            return False
        ana.bind(iv.var, tvm.ir.Range(0, n))
    if not _at(store.indices, ivs, ana):
        return False
    value = ana.simplify(store.value)
    return isinstance(value, tvm.ir.TensorLoad) and value.source.same_as(src) and _at(value.indices, ivs, ana)


def _at(indices, ivs, ana) -> bool:
    """``indices`` are exactly the block iterators, in order."""
    return len(indices) == len(ivs) and all(ana.can_prove_equal(i, iv.var) for i, iv in zip(indices, ivs))
