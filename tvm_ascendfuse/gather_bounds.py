"""GatherBoundsCheck: a gather from a table at indices known only at run time reads inside the table, and an
index outside it stops the call with one line naming where the index came from.

TVM's ONNX importer lowers every Gather to ``take(..., mode="fast")``: no bounds check. A token id at or past
the vocabulary, or a GPT-2 decode step whose cache has grown past the model's learned positions, then reads
memory outside the table: a silent wrong answer, or a segfault for a large index. ONNX Runtime refuses both
("indices element out of data bounds").

Each such gather (constant table, indices computed at run time) reads at indices clamped into the table
(``mode="clip"``: the same gather, one min/max per index), and the function ends with an assertion that the
smallest index is >= 0 and the largest < the table's rows (one small reduction kernel per gather), raised by
the VM as ``AssertionError`` with the largest index in the message. The message names what the index depends
on: the model's inputs, else the symbolic sizes (a position computed from the cache length ``past``).
Indices that are negative in the model (ONNX allows -n..-1) were made positive by the importer already.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .ir import op_name
from .passbase import PyPass


class GatherBoundsCheck(PyPass):
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions.items():
            if isinstance(func, relax.Function) and not (func.attrs and "Primitive" in func.attrs):
                new = _check_gathers(func)
                if new is not None:
                    updates[gv] = new
        for gv, func in updates.items():
            mod[gv] = func
        return mod


def _check_gathers(func: relax.Function) -> relax.Function | None:
    body = func.body
    if not isinstance(body, relax.SeqExpr) or not body.blocks:
        return None
    values = {b.var: b.value for block in body.blocks for b in block.bindings}
    params = set(func.params)
    found = [(i, b) for i, block in enumerate(body.blocks) if isinstance(block, relax.DataflowBlock)
             for b in block.bindings if _unchecked_gather(b.value)]
    if not found:
        return None
    checks, swap = [], {}
    for i, binding in found:
        call = binding.value
        table, indices = call.args
        rows = int(table.ty.shape.values[int(call.attrs.axis) % len(table.ty.shape.values)])
        swap[binding.var] = relax.op.take(table, indices, axis=int(call.attrs.axis), mode="clip")
        checks.append((i, indices, rows, _source(indices, values, params)))
    return _rebuild(func, swap, checks)


def _unchecked_gather(value) -> bool:
    """A ``take`` in fast mode from a constant table along one static axis, at indices computed at run
    time (not a constant: a constant index is checked by the importer's folding)."""
    if op_name(value) != "relax.take" or value.attrs.mode != "fast" or value.attrs.axis is None:
        return False
    table, indices = value.args
    if not isinstance(table, tvm.ir.GenericConst) or isinstance(indices, tvm.ir.GenericConst):
        return False
    axis = int(value.attrs.axis) % len(table.ty.shape.values)
    return isinstance(table.ty.shape.values[axis], tvm.tirx.IntImm)


def _source(indices, values: dict, params: set) -> str:
    """What the indices are computed from: the function's inputs they read, else the symbolic sizes."""
    inputs, sizes, stack, seen = [], set(), [indices], set()
    while stack:
        e = stack.pop()
        if not isinstance(e, relax.Var) or e in seen:
            continue
        seen.add(e)
        if e in params:
            inputs.append(e.name)
            continue
        value = values.get(e)
        if value is None:
            continue
        sizes |= {v.name for v in relax.analysis.tir_vars_in_type(e.ty)}
        if isinstance(value, relax.Call):
            stack += list(value.args)
            for arg in value.args:
                if isinstance(arg, relax.ShapeExpr):
                    sizes |= {v.name for d in arg.values for v in tvm.tirx.analysis.undefined_vars(d)}
        elif isinstance(value, relax.Tuple):
            stack += list(value.fields)
        elif isinstance(value, relax.Var):
            stack.append(value)
    if inputs:
        return "input " + ", ".join(f"'{n}'" for n in sorted(set(inputs)))
    if sizes:
        return "the sizes " + ", ".join(f"'{n}'" for n in sorted(sizes)) + " (e.g. a position from a cache length)"
    return "a value computed in the model"


def _rebuild(func: relax.Function, swap: dict, checks: list) -> relax.Function:
    """The function with the gathers clamped and, per gather, the range check's flag computed in its
    dataflow block (an output of it) and asserted after the block."""
    body = func.body
    blocks = list(body.blocks)
    asserts: dict[int, list] = {}
    for n, (i, indices, rows, source) in enumerate(checks):
        block = blocks[i]
        low = relax.DataflowVar(f"gather_low{n}", relax.TensorType((), indices.ty.dtype))
        high = relax.Var(f"gather_high{n}", relax.TensorType((), indices.ty.dtype))
        inside = relax.Var(f"gather_inside{n}", relax.TensorType((), "bool"))
        zero, limit = relax.const(0, indices.ty.dtype), relax.const(rows, indices.ty.dtype)
        extra = [relax.VarBinding(low, relax.op.min(indices)),
                 relax.VarBinding(high, relax.op.max(indices)),
                 relax.VarBinding(inside, relax.op.logical_and(relax.op.greater_equal(low, zero),
                                                               relax.op.less(high, limit)))]
        bindings = [relax.VarBinding(b.var, swap.get(b.var, b.value)) for b in block.bindings]
        blocks[i] = relax.DataflowBlock(bindings + extra)
        message = (f"{source}: an index of a gather is outside the table's {rows} rows (largest index {{}}); "
                   f"ONNX Gather requires -{rows} <= index < {rows}")
        asserts.setdefault(i, []).append(relax.VarBinding(
            relax.Var(f"gather_checked{n}", relax.TupleType([])), relax.op.assert_op(inside, [high], message)))
    out = []
    for i, block in enumerate(blocks):
        out.append(block)
        if i in asserts:
            out.append(relax.BindingBlock(asserts[i]))
    return relax.Function(func.params, relax.SeqExpr(out, body.body), func.ret_ty, func.is_pure, func.attrs,
                          func.span)
