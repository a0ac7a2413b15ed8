"""SixteenBitStoragePass: kernels load and store their GM tensors in 16 bits, compute in float32.

After scheduling, every float32 tensor that goes from one kernel to the next (``call_tir`` output read only by
other ``call_tir`` calls) is stored in the plan's 16-bit dtype: the producer's stores become
``out16[i] = cast(f16, value)`` and each consumer's loads ``cast(f32, in16[i])``. The schedules are unchanged:
a vectorised load of 16 lanes becomes a 16-lane half load and one conversion (F16C ``vcvtph2ps`` /
``vcvtps2ph`` on x86; bf16 by shifts), so every rule's vector path keeps its speed and GM traffic halves.

Why after scheduling and not as casts in the graph: the kernel boundaries are only known once the grouping has
run, and casts in the graph would stand between the ops every fusion pattern matches (conv -> add -> relu).

A tensor stays float32 when:

* it is the model's output, a tuple, or read by anything but a kernel call (the VM's view ops);
* its producer reads its output buffer back (accumulates in place): it would accumulate in 16 bits;
* a kernel uses the buffer other than by plain loads and stores (an address passed to a packed call, a
  reader's region matched as a buffer of its own; a producer's region matched and only stored to, as the
  conv rule's transposed tile stores, is held in 16 bits with it);
* the mode keeps the producer's ops in float32 (mixed modes: softmax, norms, reductions, exp/log);
* precision repair measured the producer's 16-bit output drifting (``plan.keep_kernels``, ``repair.py``).

A tensor some reader loads one element at a time inside its vector loop (a conv's input pixel broadcast to
an FMA, a GEMM's left operand) is stored as float32 holding the value rounded to 16 bits (the producer's
stores round): the numbers are the 16-bit build's, and no reader converts in its inner loop
(``loads_are_vectors``; counted in the report's ``left_fp32``).

A kernel called with different storage at different call sites gets one copy per combination. A kernel that
only converts between the storage dtype and float32 (a model in fp16: on entry and exit) becomes a copy and
is dropped.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

import re
from collections import Counter

from ..analysis.kernels import launched_kernels
from ..passbase import PyPass
from ..report import FusionReport
from .modes import keeps_fp32

PASS_NAME = "SixteenBitStorage"

class SixteenBitStoragePass(PyPass):
    """See the module docstring. ``plan``: the build's ``PrecisionPlan``; nothing happens when its
    storage dtype is None (float32 builds)."""

    def __init__(self, report: FusionReport, plan):
        self.report = report
        self.plan = plan

    def pass_name(self) -> str:
        return PASS_NAME

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        dtype = self.plan.storage_dtype
        if dtype is None:
            return mod
        ops = {k["name"]: k.get("ops") for k in self.report.kernels}
        summary = {"dtype": dtype, "mode": self.plan.mode, "kernels": {}, "kept_fp32": [], "dropped_copies": [],
                   "left_fp32": Counter()}   # tensors between kernels the host keeps in float32, by reason
        # the kernels' copies are added through one builder so their GlobalVars carry their signatures
        builder = relax.BlockBuilder(mod)
        updates = {}
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function) and not (func.attrs and "Primitive" in func.attrs):
                rewrite = _Rewrite(mod, builder, dtype, ops, self.plan.keeps_fp32_ops, summary,
                                   self.plan.keep_kernels)
                new = rewrite.function(func, gv.name_hint)
                if new is not None:
                    updates[gv] = new
        for gv, func in updates.items():
            builder.update_func(gv, func)
        out = relax.transform.DeadCodeElimination()(builder.get()) if updates else mod
        summary["left_fp32"] = dict(summary["left_fp32"])
        self.report.sections["precision"] = summary
        # the traffic table names kernels as the grouping did (before the schedule phase renamed them)
        grouped = {r["name"]: r.get("source_name", r["name"]) for r in self.report.kernels}
        _drop_from_traffic(self.report, [grouped.get(n, n) for n in summary["dropped_copies"]])
        _rename_rows(self.report, summary["kernels"], Counter(launched_kernels(out)))
        _precision_rows(self.report, out)
        return out


def _rename_rows(report, copies: dict, launches: Counter) -> None:
    """Report rows for the kernels' 16-bit copies, each after the row it copies (the original row, its name,
    its GM dtypes, its launches); rows of kernels no longer launched are dropped."""
    by_source: dict = {}
    for name, info in copies.items():
        by_source.setdefault(info["from"], []).append((name, info))
    out = []
    for r in report.kernels:
        if launches.get(r["name"]):
            out.append(dict(r, launches=launches[r["name"]]))
        for name, info in by_source.get(r["name"], []):
            row = dict(r)
            row.update(name=name, source_kernel=info["from"], launches=launches.get(name, 0),
                       precision={"compute": "float32", "inputs": info["inputs"], "output": info["output"],
                                  **({"output_rounded_to": info["output_rounded_to"]}
                                     if "output_rounded_to" in info else {})})
            out.append(row)
    report.kernels[:] = out


def _drop_from_traffic(report, dropped: list) -> None:
    """The traffic table without the launches of the conversion kernels dropped here (counted before)."""
    sec = report.sections.get("traffic") or {}
    rows, ours = sec.get("kernels") or {}, sec.get("ours")
    for name in dropped:
        row = rows.get(name)
        if row is None or ours is None or row.get("launches", 0) <= 0:
            continue
        row["launches"] -= 1
        ours["launches"] -= 1
        ours["gm_bytes"] -= row["gm_bytes"]
        ours["modeled_time_us"] = round(ours["modeled_time_us"] - row["modeled_time_us"], 3)
        if row["launches"] == 0:
            del rows[name]


def _precision_rows(report, mod) -> None:
    """Every kernel row of a 16-bit build says what it computes in and the dtypes it reads and writes."""
    funcs = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    for row in report.kernels:
        func = funcs.get(row["name"])
        if "precision" in row or func is None:
            continue
        dtypes = [str(p.ty.dtype) for p in func.params if isinstance(p.ty, tirx.BufferType)]
        row["precision"] = {"compute": "float32", "inputs": dtypes[:-1], "output": dtypes[-1] if dtypes else None}


def static_shape_of(var):
    ty = var.ty
    shape = getattr(ty, "shape", None)
    return None if shape is None else tuple(str(d) for d in shape)


def _tensor_dtype(ty) -> str | None:
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


def _call_tir(value):
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.call_tir" \
            and isinstance(value.args[0], tvm.ir.GlobalVar) and isinstance(value.args[1], relax.Tuple):
        return value
    return None


class _Rewrite:
    def __init__(self, mod, builder, dtype, kernel_ops, keep_ops, summary, keep_kernels=frozenset()):
        self.mod, self.builder, self.dtype, self.kernel_ops, self.summary = mod, builder, dtype, kernel_ops, summary
        self.keep_ops, self.keep_kernels = keep_ops, keep_kernels
        self.rounded = set()        # tensors stored as float32 holding values rounded to the 16-bit dtype
        self.clones = {}            # (kernel name, signature) -> GlobalVar

    def function(self, func: relax.Function, name: str):
        if not isinstance(func.body, relax.SeqExpr):
            return None
        bindings = [b for block in func.body.blocks for b in block.bindings]
        producers = {}
        uses = {}
        for b in bindings:
            if isinstance(b, relax.VarBinding):
                call = _call_tir(b.value)
                if call is not None:
                    producers[b.var] = call
                    for i, a in enumerate(call.args[1].fields):
                        if isinstance(a, relax.Var):
                            uses.setdefault(a, []).append((b.var, i))
                    continue
            relax.analysis.post_order_visit(b.value, lambda e: uses.setdefault(e, []).append(None)
                                            if isinstance(e, relax.Var) else None)
        relax.analysis.post_order_visit(func.body.body, lambda e: uses.setdefault(e, []).append(None)
                                        if isinstance(e, relax.Var) else None)
        chosen = set()
        left = self.summary["left_fp32"]
        for var, call in producers.items():
            if _tensor_dtype(var.ty) != "float32" or not uses.get(var):
                continue
            kname = call.args[0].name_hint
            if any(u is None for u in uses[var]):
                left["read by other than a kernel (model output, view)"] += 1
                continue
            kernel = self.mod[call.args[0]]
            n_in = len(call.args[1].fields)
            if len(kernel.params) != n_in + 1:
                left["an output of a kernel with several"] += 1
                continue
            if kname in self.keep_kernels:
                self.summary["kept_fp32"].append({"tensor": var.name, "kernel": kname, "op": None, "why": "repair"})
                continue
            if self.keep_ops:
                kept = keeps_fp32(self.kernel_ops.get(kname))
                if kept is not None:
                    self.summary["kept_fp32"].append({"tensor": var.name, "kernel": kname, "op": kept})
                    continue
            if not _convertible(kernel, kernel.params[n_in], output=True):
                left["its kernel reads its output back (accumulates in it)"] += 1
                continue
            readers = [(self.mod[producers[user].args[0]], i) for user, i in uses[var]]
            if not all(_convertible(f, f.params[i], output=False) for f, i in readers):
                left["a reader uses the buffer other than by loads (rounded, float32)"] += 1
                self.rounded.add(var)
            elif not all(loads_are_vectors(f, f.params[i]) for f, i in readers):
                # float32 in GM on the host, holding the 16-bit value: the 16-bit build's numbers, and no
                # conversion in a reader's inner loop
                left["a reader loads it one element at a time in its vector loop (rounded, float32)"] += 1
                self.rounded.add(var)
            else:
                chosen.add(var)
        if not chosen and not self.rounded:
            return None
        return self._emit(func, name, bindings, producers, chosen)

    def _emit(self, func, name, bindings, producers, chosen):
        remap = {}

        def sub(e):
            if isinstance(e, relax.Var):
                return remap.get(e, e)
            if isinstance(e, relax.Tuple):
                return relax.Tuple([sub(f) for f in e.fields])
            if isinstance(e, relax.TupleGetItem):
                return relax.TupleGetItem(sub(e.tuple_value), e.index)
            if isinstance(e, relax.Call):
                return relax.Call(e.op, [sub(a) for a in e.args], e.attrs, e.ty_args)
            return e

        bb = relax.BlockBuilder()
        with bb.function(name, list(func.params), attrs=dict(func.attrs) if func.attrs else None, private=False):
            with bb.dataflow():
                for b in bindings:
                    call = producers.get(b.var)
                    if call is not None and self._copy_in_storage(call, b.var, chosen):
                        remap[b.var] = sub(call.args[1].fields[0])
                        self.summary["dropped_copies"].append(call.args[0].name_hint)
                        continue
                    if call is None:
                        value = sub(b.value)
                    else:
                        args = [sub(a) for a in call.args[1].fields]
                        ins = tuple(isinstance(a, relax.Var) and a in chosen for a in call.args[1].fields)
                        out = True if b.var in chosen else ("round" if b.var in self.rounded else False)
                        gv = self._kernel(call.args[0], ins, out)
                        ty = call.ty_args[0]
                        if out is True:
                            ty = relax.TensorType(ty.shape, self.dtype)
                        elif isinstance(ty, relax.TupleType):     # several outputs (never stored in 16 bits)
                            ty = list(ty.fields)
                        value = relax.call_tir(gv, relax.Tuple(args), ty)
                    remap[b.var] = bb.emit(value, name_hint=b.var.name)
                result = bb.emit_output(sub(func.body.body))
            bb.emit_func_output(result)
        return bb.get()[name]

    def _copy_in_storage(self, call, var, chosen) -> bool:
        """A kernel that only converts its one input between the storage dtype and float32, when both its input
        and its output are stored in 16 bits: a copy (the conversions a model in fp16 gets on entry and exit,
        ``Float32ComputePass``), dropped."""
        ops = self.kernel_ops.get(call.args[0].name_hint) or []
        args = call.args[1].fields
        if len(ops) != 1 or not re.fullmatch(r"cast\d*", str(ops[0]).split(".")[-1]) or len(args) != 1:
            return False
        src = args[0]
        stored = lambda v: isinstance(v, relax.Var) and (v in chosen or _tensor_dtype(v.ty) == self.dtype)
        return stored(src) and stored(var) and static_shape_of(src) == static_shape_of(var)

    def _kernel(self, gv, ins, out):
        if not any(ins) and not out:
            return gv
        key = (gv.name_hint, ins, out)
        if key not in self.clones:
            func = self.mod[gv]
            n_in = len(ins)
            buffers = [p for p, flag in zip(func.params, ins) if flag] + ([func.params[n_in]] if out is True else [])
            new = _store_sixteen_bit(func, buffers, self.dtype, [func.params[n_in]] if out == "round" else [])
            suffix = "".join("h" if f else "f" for f in ins) + {True: "h", "round": "r", False: "f"}[out]
            new_gv = self.builder.add_func(new, f"{gv.name_hint}_{suffix}")
            self.clones[key] = new_gv
            self.summary["kernels"][new_gv.name_hint] = {
                "from": gv.name_hint, "inputs": [self.dtype if f else str(p.ty.dtype)
                                                 for f, p in zip(ins, func.params)],
                "output": self.dtype if out is True else str(func.params[n_in].ty.dtype)}
            if out == "round":
                self.summary["kernels"][new_gv.name_hint]["output_rounded_to"] = self.dtype
        return self.clones[key]


def _convertible(func, buf, output: bool) -> bool:
    """Whether ``buf`` (a float32 parameter of ``func``) is used by plain loads and stores only, and, for an
    output, never read back."""
    if not isinstance(buf.ty, tirx.BufferType) or str(buf.ty.dtype) != "float32":
        return False
    bad = []

    def on_load(load):
        if load.source.same_as(buf) and output:
            bad.append("read back")

    def on_call(call):
        # an address of the buffer handed to a packed/extern call
        for a in getattr(call, "args", ()):
            if isinstance(a, tvm.ir.TensorLoad) and a.source.same_as(buf):
                bad.append("address taken")

    def on_match(match):
        # a region of the buffer viewed as another buffer: an output's region only stored to (a conv's
        # transposed tile stores) is held in the same dtype (``matched_views``); anything else stays float32
        if any(v.same_as(buf) for v in _vars_of(match.source)) and not output:
            bad.append("matched")

    tvm_ffi.structural_walk(func.body, [(tvm.ir.TensorLoad, on_load), (tvm.ir.expr.Call, on_call),
                                        (s_tir.MatchBufferRegion, on_match)])
    if output and not bad:
        for view in matched_views(func, buf):
            if not _convertible(func, view, output=True):
                return False
    return not bad


def matched_views(func: tirx.PrimFunc, buf) -> list:
    """The buffers that view a region of ``buf`` (``match_buffer`` in a block)."""
    views = []

    def on_match(match):
        if any(v.same_as(buf) for v in _vars_of(match.source)):
            views.append(match.buffer)

    tvm_ffi.structural_walk(func.body, (s_tir.MatchBufferRegion, on_match))
    return views


def _vars_of(expr) -> list:
    found = []
    tvm_ffi.structural_walk(expr, (tvm.ir.Var, lambda v: found.append(v)))
    return found


def loads_are_vectors(func: tirx.PrimFunc, buf) -> bool:
    """Whether every load of ``buf`` in a computation is a vector load (an index follows a vectorised loop) or
    a plain copy (staging into an on-chip buffer), so that reading it in 16 bits costs one conversion per
    vector. A load of one element broadcast into a vector loop (a conv's input pixel, a GEMM's left operand:
    one element per FMA row) converts one element per FMA: stored in 16 bits, ResNet-50's conv kernels ran
    1.9x their float32 time on Zen 5."""
    vector_vars = []
    tvm_ffi.structural_walk(func.body, (tirx.For, lambda f: vector_vars.append(f.loop_var)
                                        if f.kind == tirx.ForKind.VECTORIZED else None))
    if not vector_vars:
        return True                  # nothing is vectorised here: no vector path to slow down
    follows = set(v.__chandle__() for v in vector_vars)

    def on_realize(realize):
        for iv, value in zip(realize.block.iter_vars, realize.iter_values):
            if any(v.__chandle__() in follows for v in _vars_of(value)):
                follows.add(iv.var.__chandle__())

    # block variables bound to vectorised loops (the walk visits outer blocks before inner ones)
    tvm_ffi.structural_walk(func.body, (s_tir.SBlockRealize, on_realize))
    scalar = []

    def on_store(store):
        value = store.value
        inner = value.value if isinstance(value, tvm.ir.prim.expr.Cast) else value
        if isinstance(inner, tvm.ir.TensorLoad) and inner.source.same_as(buf):
            return                   # a copy (staging): converted once per element, vectorised with it

        def on_load(load):
            if load.source.same_as(buf) and not any(
                    v.__chandle__() in follows for i in load.indices for v in _vars_of(i)):
                scalar.append(load)

        tvm_ffi.structural_walk(value, (tvm.ir.TensorLoad, on_load))

    tvm_ffi.structural_walk(func.body, (tirx.BufferStore, on_store))
    return not scalar


def _retyped(var, dtype):
    t = var.ty
    return tvm.ir.Var(var.name, tirx.BufferType(dtype, t.storage_scope, t.shape, t.strides, t.elem_offset,
                                                 t.data_alignment, t.offset_factor, t.layout, t.allocated_addr))


def _expr_dtype(expr) -> str:
    ty = getattr(expr, "ty", None)
    return str(ty.dtype) if ty is not None and hasattr(ty, "dtype") else str(expr.dtype)


def _with_base(dtype: str, base: str) -> str:
    lanes = dtype.split("x")[1] if "x" in dtype else None
    return f"{base}x{lanes}" if lanes else base


def _has_let(expr) -> bool:
    found = []
    tvm_ffi.structural_walk(expr, (tirx.Let, lambda e: found.append(e)))
    return bool(found)


def _narrowed(value, dtype: str):
    """``cast(dtype, value)``; for bfloat16, a value holding a ``let`` (GELU's erf argument) has its lets
    inlined first: TVM's bfloat16 legalization rounds the stored value by integer arithmetic that reads it
    twice, and the two copies of one ``let`` stop the loop vectorizer ("Let cannot bind the same var to two
    different values"). LLVM merges the repeated expressions again."""
    if dtype.startswith("bfloat16"):
        for _ in range(8):
            if not _has_let(value):
                break
            value = tvm_ffi.structural_map(value, (tirx.Let, _inline_let))
    return tirx.Cast(dtype, value)


def _inline_let(let):
    return tvm_ffi.structural_map(let.body, (tvm.ir.Var, lambda v: let.value if v.same_as(let.var) else v))


def _store_sixteen_bit(func: tirx.PrimFunc, buffers, dtype: str, rounded=()) -> tirx.PrimFunc:
    """``func`` with ``buffers`` (float32 parameters) held in ``dtype``: loads converted up, stores down;
    ``rounded`` (float32 outputs) stay float32 and receive values rounded to ``dtype``."""
    # an output's regions viewed as buffers of their own (only stored to, ``_convertible``) take its dtype
    views = [v for b in buffers for v in matched_views(func, b)]
    new = {b: _retyped(b, dtype) for b in [*buffers, *views]}

    def round_store(store):
        if not any(store.buffer.same_as(b) for b in rounded):
            return store
        wide = _expr_dtype(store.value)
        narrow = _narrowed(store.value, _with_base(wide, dtype))
        return tirx.BufferStore(store.buffer, tirx.Cast(wide, narrow), list(store.indices))

    if rounded:
        func = tvm_ffi.structural_map(func, (tirx.BufferStore, round_store))

    def find(buf):
        for old, nb in new.items():
            if buf.same_as(old):
                return nb
        return None

    def on_load(load):
        nb = find(load.source)
        if nb is None:
            return load
        wide = _expr_dtype(load)
        narrow = tirx.BufferLoad(nb, list(load.indices))
        return tirx.Cast(_with_base(wide, "float32"), narrow)

    def on_store(store):
        nb = find(store.buffer)
        if nb is None:
            return store
        value = store.value
        return tirx.BufferStore(nb, _narrowed(value, _with_base(_expr_dtype(value), dtype)), list(store.indices))

    body = tvm_ffi.structural_map(func, [(tvm.ir.TensorLoad, on_load), (tirx.BufferStore, on_store)])

    def on_var(v):
        nb = find(v)
        return v if nb is None else nb

    mapped = tvm_ffi.structural_map(body, (tvm.ir.Var, on_var))
    # rebuilt, not mapped: the function's signature type is derived from its parameters at construction
    return tirx.PrimFunc(list(mapped.params), mapped.body, func.ret_type, func.attrs)
