"""Equivalence of the fused build, checked by the tool itself.

``verify_compiled`` runs the compiled model and an unfused reference (ONNX Runtime on the ONNX model, eager
PyTorch on an exported program, or TVM's default pipeline on the module as imported) on the same seeded
random inputs and compares every output against a tolerance for its dtype. On a mismatch it *bisects*: the
executable runs again with the VM's instrumentation hook capturing every kernel call's inputs and outputs,
and each kernel's unscheduled PrimFunc (the same fused ops, as FuseTIR made them, lowered by TVM without our
schedule) runs on exactly those inputs. The first kernel in execution order whose output differs is named
with its source ops; a kernel after it that is right on its (wrong) inputs is not blamed.

Inputs: floats standard normal; integers used as gather indices (``take``: token ids into an embedding)
drawn below the gathered axis's size, other integers 0 or 1, booleans random. Symbolic dims take their
declared upper bound (capped at ``SYMBOLIC_DIM``) or ``SYMBOLIC_DIM``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import tvm
from tvm import relax

from .errors import ModelError
from .progress import bar

# (rtol, atol) per dtype; atol is a fraction of the reference output's largest magnitude, so the check means
# the same for a logit in the tens as for an output of 1e-4 (with an absolute floor, a small output would
# hide a wrong kernel: any error below the floor passes). float32: every element within 1e-3 of the output's
# scale, nothing relative to the element itself. A per-element bound tighter than that is below what two
# correct runtimes agree to on a deep model with random weights: ONNX Runtime's own optimised and unoptimised
# runs of timm's Inception-v4 differ by 6e-4 of the output's scale (float sums reassociated ~150 layers deep).
TOLERANCE = {"float64": (1e-7, 1e-7), "float32": (0.0, 1e-3), "float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2)}
# A build that stores its tensors in 16 bits (precision modes, or a model stored in fp16) against a reference:
# (largest |ours - ref| as a fraction of max |ref|, smallest cosine similarity). Rounding every kernel's
# output to 16 bits through a deep model adds up: FP16 ResNet-50 and BERT-base differ from ONNX Runtime's
# own fp16 run by 1.2-1.4% of the output's scale with a cosine of 0.9999; bf16 keeps 3 fewer mantissa bits.
STORAGE_TOLERANCE = {"float16": (3e-2, 0.999), "bfloat16": (1e-1, 0.99)}
SYMBOLIC_DIM = 8
# A quantized model (quantize/dequantize ops, int8 GEMMs) is not computed the same way by two runtimes: a
# value on a rounding boundary goes one way or the other, and the step propagates. Its float outputs are
# compared by cosine similarity (the direction of the output: a wrong kernel gives far less), its integer
# outputs within one quantization step.
QUANT_COSINE = 0.99
QUANT_INT_STEPS = 1
_QUANT_OPS = ("relax.quantize", "relax.dequantize")
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
NO_OP, SKIP_RUN = int(relax.VMInstrumentReturnKind.NO_OP), int(relax.VMInstrumentReturnKind.SKIP_RUN)


def tolerance(dtype: str) -> tuple[float, float]:
    """(rtol, atol) for ``dtype``: 0 for integer and boolean outputs (they must be equal)."""
    return TOLERANCE.get(str(dtype), (0.0, 0.0))


@dataclass
class Comparison:
    name: str
    dtype: str
    shape: tuple
    max_abs: float
    max_rel: float       # max |ours - ref| / max |ref|
    rtol: float
    atol: float
    ok: bool
    cosine: float | None = None        # checked for 16-bit builds only
    min_cosine: float | None = None

    def to_dict(self) -> dict:
        out = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "max_abs": self.max_abs,
               "max_rel": self.max_rel, "rtol": self.rtol, "atol": self.atol, "ok": self.ok}
        if self.min_cosine is not None:
            out.update(cosine=self.cosine, min_cosine=self.min_cosine)
        return out


def is_quantized(mod: tvm.IRModule) -> bool:
    """Whether a Relax module quantizes or dequantizes anything (a QDQ or dynamically quantized model)."""
    found = []

    def visit(expr):
        if not found and isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
                and expr.op.name in _QUANT_OPS:
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return bool(found)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, "float64").ravel(), np.asarray(b, "float64").ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))


def compare(name: str, ours: np.ndarray, ref: np.ndarray, storage: str | None = None,
            quantized: bool = False) -> Comparison:
    """``storage``: the 16-bit dtype the build keeps its tensors in (None: the output's own dtype decides
    the tolerance); ``quantized``: the tolerances of a quantized model (``QUANT_COSINE``, ``QUANT_INT_STEPS``)."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    if storage in STORAGE_TOLERANCE and ref.dtype.kind == "f":
        return _compare_sixteen_bit(name, ours, ref, storage)
    dtype = str(ref.dtype)
    rtol, atol = tolerance(dtype)
    if ours.shape != ref.shape:
        return Comparison(name, dtype, ref.shape, float("inf"), float("inf"), rtol, atol, False)
    if quantized:
        return _compare_quantized(name, ours, ref)
    a, b = ours.astype("float64"), ref.astype("float64")
    finite = np.isfinite(a) & np.isfinite(b)
    diff = np.abs(a - b, where=finite, out=np.zeros_like(a))
    scale = float(np.max(np.abs(b[np.isfinite(b)]), initial=0.0))
    bound = atol * scale + rtol * np.abs(np.where(finite, b, 0.0))
    # NaN where the reference has NaN, the same infinity where it has one, otherwise within the bound
    same_special = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & np.isinf(b) & (a == b))
    ok = bool(np.all(same_special | (finite & (diff <= bound))))
    max_abs = float(np.max(diff, initial=0.0)) if np.all(finite | same_special) else float("inf")
    return Comparison(name, dtype, ref.shape, max_abs, max_abs / scale if scale else max_abs, rtol, atol, ok)


def _compare_sixteen_bit(name: str, ours: np.ndarray, ref: np.ndarray, storage: str) -> Comparison:
    """A 16-bit build: the largest error on the output's scale and the cosine similarity, both bounded."""
    atol, min_cos = STORAGE_TOLERANCE[storage]
    dtype = f"{ref.dtype}/{storage}"
    if ours.shape != ref.shape:
        return Comparison(name, dtype, ref.shape, float("inf"), float("inf"), 0.0, atol, False, None, min_cos)
    a, b = ours.astype("float64").ravel(), ref.astype("float64").ravel()
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        same = bool(np.array_equal(np.isnan(a), np.isnan(b)) and np.all(a[np.isinf(b)] == b[np.isinf(b)])
                    and np.all(np.isfinite(a[np.isfinite(b)])))
        if not same:
            return Comparison(name, dtype, ref.shape, float("inf"), float("inf"), 0.0, atol, False, None, min_cos)
        keep = np.isfinite(b)
        a, b = a[keep], b[keep]
    diff = float(np.max(np.abs(a - b), initial=0.0))
    scale = float(np.max(np.abs(b), initial=0.0))
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    cos = float(a @ b / norms) if norms else (1.0 if diff == 0 else 0.0)
    rel = diff / scale if scale else diff
    ok = rel <= atol and cos >= min_cos
    return Comparison(name, dtype, ref.shape, diff, rel, 0.0, atol, ok, cos, min_cos)


def _compare_quantized(name: str, ours: np.ndarray, ref: np.ndarray) -> Comparison:
    a, b = ours.astype("float64"), ref.astype("float64")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        same = bool(np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(a[~np.isnan(a)], b[~np.isnan(b)]))
        return Comparison(name, str(ref.dtype), ref.shape, float("inf"), float("inf"), 0.0, 0.0, same)
    diff = np.abs(a - b)
    max_abs = float(diff.max(initial=0.0))
    scale = float(np.abs(b).max(initial=0.0))
    if ref.dtype.kind in "iu":      # quantized values: at most QUANT_INT_STEPS apart
        return Comparison(name, str(ref.dtype), ref.shape, max_abs, max_abs / scale if scale else max_abs,
                          0.0, float(QUANT_INT_STEPS), max_abs <= QUANT_INT_STEPS)
    cos = cosine(a, b)
    return Comparison(name, str(ref.dtype), ref.shape, max_abs, max_abs / scale if scale else max_abs,
                      0.0, 0.0, cos >= QUANT_COSINE, cosine=cos,
                      min_cosine=QUANT_COSINE)


# ---- inputs -------------------------------------------------------------------------------------------
def _static(dim, bounds) -> int:
    if isinstance(dim, tvm.tirx.IntImm):
        return int(dim)
    name = getattr(dim, "name", None)
    upper = bounds.get(name)
    return min(int(upper), SYMBOLIC_DIM) if upper is not None else SYMBOLIC_DIM


def _index_bounds(func: relax.Function) -> dict:
    """Param -> exclusive upper bound of its values where the param (through layout ops and casts) is the
    indices of a ``take`` with a static gathered axis."""
    var2val = relax.analysis.get_var2val(func)
    # layout ops, casts, and the ONNX importer's negative-index wrap where(ids < 0, ids + n, ids)
    passthrough = {"relax.astype", "relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.permute_dims",
                   "relax.flatten", "relax.where", "relax.add", "relax.clip"}
    params = set(func.params)

    def root(expr, depth=0):
        if expr in params:
            return expr
        val = var2val.get(expr) if isinstance(expr, relax.Var) else None
        if depth > 8 or not (isinstance(val, relax.Call) and isinstance(val.op, tvm.ir.Op)
                             and val.op.name in passthrough):
            return None
        args = val.args[1:] if val.op.name == "relax.where" else val.args
        found = {r for r in (root(a, depth + 1) for a in args) if r is not None}
        return found.pop() if len(found) == 1 else None

    bounds: dict = {}
    for val in var2val.values():
        if isinstance(val, relax.Call) and isinstance(val.op, tvm.ir.Op) and val.op.name == "relax.take":
            p = root(val.args[1])
            table = val.args[0].ty
            if p is None or not isinstance(table, relax.TensorType) or table.shape is None:
                continue
            axis = int(val.attrs.axis) if val.attrs.axis is not None else 0
            dim = table.shape[axis % len(table.shape)]
            if isinstance(dim, tvm.tirx.IntImm):
                bounds[p] = min(bounds.get(p, int(dim)), int(dim))
    return bounds


def make_inputs(mod: tvm.IRModule, seed: int = 0, func: str = "main") -> tuple[list[np.ndarray], list[dict]]:
    """Seeded inputs for ``mod[func]`` and a description of each (name, shape, dtype, range)."""
    f = mod[func]
    attrs = f.attrs or {}
    bounds = {str(k): int(v) for k, v in dict(attrs.get("tir_var_upper_bound", {})).items()}
    index_bounds = _index_bounds(f)
    rng = np.random.default_rng(seed)
    arrays, info = [], []
    for p in f.params:
        ty = p.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            raise ModelError(f"input '{p.name}' is not a tensor of known rank; --verify cannot make inputs for it")
        shape = tuple(_static(d, bounds) for d in ty.shape)
        dtype = str(ty.dtype)
        if dtype == "bool":
            arr, rng_text = rng.integers(0, 2, shape).astype(bool), "{0, 1}"
        elif dtype.startswith(("int", "uint")):
            high = index_bounds.get(p, 2)
            arr, rng_text = rng.integers(0, high, shape).astype(dtype), f"[0, {high})"
        else:
            arr, rng_text = rng.standard_normal(shape).astype(dtype), "normal(0, 1)"
        arrays.append(arr)
        info.append({"name": p.name, "shape": list(shape), "dtype": dtype, "range": rng_text})
    return arrays, info


# ---- references ---------------------------------------------------------------------------------------
def _as_list(res) -> list[np.ndarray]:
    if hasattr(res, "numpy"):
        return [res.numpy()]
    if isinstance(res, np.ndarray):
        return [res]
    out = []
    for r in res:
        out += _as_list(r)
    return out


def run_executable(executable, inputs, func: str = "main", instrument=None) -> list[np.ndarray]:
    vm = relax.VirtualMachine(executable, tvm.cpu())
    if instrument is not None:
        vm.set_instrument(instrument)
    return _as_list(vm[func](*[tvm.runtime.tensor(x) for x in inputs]))


def tvm_default_reference(mod: tvm.IRModule) -> Callable:
    """TVM's default CPU pipeline on ``mod``: its own fusion and lowering, none of ours."""
    target = tvm.target.Target("llvm")
    ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    return lambda inputs: run_executable(ex, inputs)


# ONNX Runtime's int8 GEMM on an x86 CPU without VNNI (AVX2) sums u8 x s8 products in saturating 16-bit pairs
# by default: a QDQ MobileNetV2 there comes out at cosine 0.957 against its own float computation. A reference
# takes the exact path, which this session option selects (no effect where VNNI does the sums).
ORT_PRECISE_INT8 = ("session.x64quantprecision", "1")


def exact_integer_ops(model):
    """``model`` with each MatMulInteger / ConvInteger spelled as float ops: the 8-bit operands cast to float,
    their zero points subtracted, a float MatMul / Conv, the sums cast back to int32. ONNX Runtime runs the
    integer ops with its int8 GEMM, which on a CPU without VNNI sums u8 x s8 products in saturating 16-bit
    pairs whatever the session options say (a dynamic-quantized GEMM there was 4% of the output's scale
    off the exact result). Float sums of such products are exact while they stay below 2**24: a 255 x 127
    product summed over fewer than 518 values, and far longer sums of typical activations, so a rare last-bit
    difference only on very deep reductions. Returns the model unchanged when it has no such op."""
    import onnx
    from onnx import TensorProto, helper

    if not any(n.op_type in ("MatMulInteger", "ConvInteger") for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for i, node in enumerate(out.graph.node):
        if node.op_type not in ("MatMulInteger", "ConvInteger"):
            nodes.append(node)
            continue
        tag = f"__exact{i}"
        ins = list(node.input) + [""] * (4 - len(node.input))
        floats = []
        for j, (value, zero) in enumerate(((ins[0], ins[2]), (ins[1], ins[3]))):
            f = f"{tag}_f{j}"
            nodes.append(helper.make_node("Cast", [value], [f], to=TensorProto.FLOAT))
            if zero:
                nodes.append(helper.make_node("Cast", [zero], [f + "_zp"], to=TensorProto.FLOAT))
                if node.op_type == "ConvInteger" and j == 1:
                    # a per-output-channel zero point of the weight: one value for each [M, C, kh, kw] slice
                    nodes.append(helper.make_node("Reshape", [f + "_zp", f"{tag}_zshape"], [f + "_zpr"]))
                    out.graph.initializer.append(helper.make_tensor(f"{tag}_zshape", TensorProto.INT64, [4],
                                                                    [-1, 1, 1, 1]))
                    nodes.append(helper.make_node("Sub", [f, f + "_zpr"], [f + "_c"]))
                else:
                    nodes.append(helper.make_node("Sub", [f, f + "_zp"], [f + "_c"]))
                f += "_c"
            floats.append(f)
        op = "MatMul" if node.op_type == "MatMulInteger" else "Conv"
        nodes.append(helper.make_node(op, floats, [f"{tag}_y"], **{a.name: helper.get_attribute_value(a)
                                                                   for a in node.attribute}))
        nodes.append(helper.make_node("Cast", [f"{tag}_y"], list(node.output), to=TensorProto.INT32))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def reference_session_options(threads: int = 0):
    """ONNX Runtime session options for a reference run: graph optimisations off (the unfused model), int8
    sums exact on every CPU, errors only in the log (ORT's warnings about the user's model, a line per unused
    initializer of a quantized export, are not a check's to print)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry(*ORT_PRECISE_INT8)
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    return so


def onnxruntime_reference(model) -> Callable | None:
    """ONNX Runtime on the ONNX model (graph optimisations off: the unfused reference); None if not installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    so = reference_session_options()
    if hasattr(model, "SerializeToString"):
        data = exact_integer_ops(model).SerializeToString()
    else:
        import onnx

        data = exact_integer_ops(onnx.load(str(model))).SerializeToString()
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return lambda inputs: [np.asarray(o) for o in sess.run(None, dict(zip(names, inputs)))]


def torch_reference(program) -> Callable:
    """Eager PyTorch on a ``torch.export`` program."""
    import torch

    module = program.module()

    def run(inputs):
        with torch.no_grad():
            out = module(*[torch.from_numpy(np.ascontiguousarray(x)) for x in inputs])
        flat = out if isinstance(out, (list, tuple)) else [out]
        return [t.detach().numpy() for t in flat]

    return run


# ---- bisection ----------------------------------------------------------------------------------------
def _kernel_calls(mod: tvm.IRModule, func: str = "main") -> list[tuple[str, list[bool], int]]:
    """(kernel name, per-argument 'is a constant', number of outputs) for each call_tir, in binding order."""
    calls = []
    for block in mod[func].body.blocks:
        for b in block.bindings:
            val = b.value
            if isinstance(val, relax.Call) and val.op.same_as(_CALL_TIR):
                args = list(val.args[1].fields) if isinstance(val.args[1], relax.Tuple) else [val.args[1]]
                outs = val.ty.fields if isinstance(val.ty, relax.TupleType) else [val.ty]
                calls.append((val.args[0].name_hint, [isinstance(a, tvm.ir.GenericConst) for a in args], len(outs)))
    return calls


class _Capture:
    """VM instrument: after each kernel call (``calls``: the build's call_tir list, in order), copies of its
    arguments, inputs then outputs; constant inputs (weights) are not copied."""

    def __init__(self, calls: list):
        self.expected = calls
        self.names = {name for name, _, _ in calls}
        self.calls: list[tuple[str, list]] = []

    def __call__(self, func, symbol, before_run, ret_value, *args):
        if before_run and symbol in self.names:
            # outputs start as NaN: an element the kernel leaves unwritten shows as a difference, instead of
            # holding whatever the reused storage had (possibly the right value from an earlier call)
            i = len(self.calls)
            n_out = self.expected[i][2] if i < len(self.expected) else 0
            inputs = {a.data_ptr() for a in args[:len(args) - n_out] if hasattr(a, "data_ptr")}
            for a in args[len(args) - n_out:]:
                if hasattr(a, "copyfrom") and str(a.dtype).startswith("float") and a.data_ptr() not in inputs:
                    poison = a.numpy()          # the tensor's own numpy dtype (bfloat16 included)
                    poison[...] = np.nan
                    a.copyfrom(poison)
            return NO_OP
        if not before_run and symbol in self.names:
            i = len(self.calls)
            consts = self.expected[i][1] if i < len(self.expected) else []
            self.calls.append((symbol, [None if j < len(consts) and consts[j] else
                                        (a.numpy() if hasattr(a, "numpy") else None) for j, a in enumerate(args)]))
        return NO_OP


class _Replay:
    """VM instrument on the unscheduled build: before kernel i, its non-constant inputs are overwritten with
    ours; after it, its outputs are compared with ours. Kernels after the first difference are skipped."""

    def __init__(self, plan: list, on_result, storage: str | None = None, quantized: bool = False):
        self.plan, self.on_result, self.storage = plan, on_result, storage
        self.quantized = quantized
        self.names = {p[0] for p in plan}
        self.index = 0
        self.done = False

    def __call__(self, func, symbol, before_run, ret_value, *args):
        if self.done:
            return SKIP_RUN if before_run and symbol in self.names else NO_OP
        if self.index >= len(self.plan) or symbol != self.plan[self.index][0]:
            return NO_OP
        _, consts, n_out, ours_args = self.plan[self.index]
        n_in = len(args) - n_out
        if before_run:
            for i in range(n_in):
                src = ours_args[i]
                if not consts[i] and src is not None and hasattr(args[i], "copyfrom") \
                        and tuple(args[i].shape) == src.shape:
                    args[i].copyfrom(src)    # converts a 16-bit build's tensor to the kernel's float32
            return NO_OP
        diffs = [compare(f"output {j}", ours_args[n_in + j], args[n_in + j].numpy(), self.storage,
                         self.quantized)
                 for j in range(n_out)]
        self.index += 1
        self.done = bool(self.on_result(self.index - 1, diffs))
        return NO_OP


def bisect(result, inputs, func: str = "main", quantized: bool = False) -> dict:
    """The first kernel (execution order) whose output differs from its unscheduled PrimFunc on the same
    inputs, with its source ops; or a note that every kernel agrees on its own inputs. ``quantized``: kernels
    are compared with the tolerances of a quantized model."""
    from .pipeline import lowering_phase

    scheduled = _kernel_calls(result.scheduled_module, func)
    unscheduled = _kernel_calls(result.fused_module, func)
    rows = {k["name"]: k for k in result.report.kernels}
    if len(scheduled) != len(unscheduled):
        return {"error": f"cannot pair kernels: {len(scheduled)} calls in the build, {len(unscheduled)} before "
                         "scheduling"}
    host = result.host_target
    with host:
        reference = tvm.compile(result.fused_module, target=host,
                                relax_pipeline=tvm.transform.Sequential(lowering_phase(host)))
    capture = _Capture(scheduled)
    run_executable(result.executable, inputs, func, capture)
    if len(capture.calls) != len(scheduled):
        return {"error": f"captured {len(capture.calls)} kernel calls, expected {len(scheduled)}"}
    plan = []
    for (name, consts, n_out), (ref_name, ref_consts, _), (_, args) in zip(scheduled, unscheduled, capture.calls):
        plan.append((ref_name, [a or b for a, b in zip(consts, ref_consts)], n_out, args))
    found: dict[str, Any] = {}
    worst = {"max_rel": -1.0}

    shown = bar(total=len(plan), desc="bisecting", unit="kernel", delay=2.0)

    def on_result(i, diffs):
        shown.update()
        name = scheduled[i][0]
        bad = [d for d in diffs if not d.ok]
        rel = max((d.max_rel for d in diffs), default=0.0)
        if rel > worst["max_rel"]:
            worst.update(max_rel=rel, kernel=name)
        if bad:
            row = rows.get(name, {})
            found.update(kernel=name, index=i, ops=row.get("ops", []), pattern=row.get("pattern"),
                         rule=row.get("rule"), unscheduled_kernel=plan[i][0], outputs=[d.to_dict() for d in diffs])
            return True
        return False

    try:
        run_executable(reference, inputs, func, _Replay(plan, on_result, storage_dtype(result), quantized))
    finally:
        shown.close()
    if found:
        return {"first_bad_kernel": found, "kernels_checked": found["index"] + 1}
    return {"first_bad_kernel": None, "kernels_checked": len(plan), "worst_kernel": worst.get("kernel"),
            "worst_max_rel": worst["max_rel"],
            "note": "every kernel matches its unscheduled form on its own inputs; the difference builds up across "
                    f"kernels (largest relative error in {worst.get('kernel')}: {worst['max_rel']:.3g})"}


# ---- the check ----------------------------------------------------------------------------------------
@dataclass
class VerifyResult:
    ok: bool
    reference: str
    seed: int
    inputs: list[dict]
    outputs: list[Comparison]
    bisection: dict | None = None
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {"ok": self.ok, "reference": self.reference, "seed": self.seed, "inputs": self.inputs,
               "outputs": [c.to_dict() for c in self.outputs], "seconds": round(self.seconds, 2)}
        if self.bisection is not None:
            out["bisection"] = self.bisection
        return out


def storage_dtype(result) -> str | None:
    """The 16-bit dtype the build stores its tensors in (``precision`` section of its report), or None."""
    return (result.report.sections.get("precision") or {}).get("dtype")


def verify_compiled(result, original: tvm.IRModule, reference: Callable | None = None,
                    reference_name: str | None = None, seed: int = 0, func: str = "main") -> VerifyResult:
    """Compare ``result`` (a ``CompileResult``) with ``reference`` (inputs -> outputs; default TVM's default
    pipeline on ``original``) on seeded inputs; bisect on a mismatch. Also written into the result's report
    (section ``verify``)."""
    t0 = time.perf_counter()
    inputs, info = make_inputs(original, seed, func)
    if reference is None:
        reference, reference_name = tvm_default_reference(original), "tvm_default"
    ours = run_executable(result.executable, inputs, func)
    refs = reference(inputs)
    names = [f"output {i}" for i in range(len(refs))]
    storage = storage_dtype(result)
    quantized = is_quantized(original)
    outputs = [compare(n, o, r, storage, quantized) for n, o, r in zip(names, ours, refs)]
    if len(ours) != len(refs):
        outputs.append(Comparison("output count", "-", (len(ours),), float("inf"), float("inf"), 0, 0, False))
    ok = all(c.ok for c in outputs)
    bisection = None if ok else bisect(result, inputs, func, quantized)
    res = VerifyResult(ok, reference_name or "reference", seed, info, outputs, bisection,
                       time.perf_counter() - t0)
    result.report.sections["verify"] = res.to_dict()
    return res


def verify_text(section: dict) -> str:
    """The verify lines of the terminal summary."""
    lines = [f"verify against {section['reference']} (seed {section['seed']}): "
             f"{'OK' if section['ok'] else 'MISMATCH'}"]
    for o in section["outputs"]:
        if o.get("min_cosine") is not None and "/" in o["dtype"]:      # a 16-bit build
            cos = "-" if o.get("cosine") is None else f"{o['cosine']:.6f}"
            lines.append(f"  {o['name']:10s} {o['dtype']:8s} max abs {o['max_abs']:.3g}  max rel {o['max_rel']:.3g}  "
                         f"cosine {cos}  (max rel <= {o['atol']:g}, cosine >= {o['min_cosine']:g})  "
                         f"{'ok' if o['ok'] else 'MISMATCH'}")
            continue
        if o.get("cosine") is not None:       # a quantized model's float output
            lines.append(f"  {o['name']:10s} {o['dtype']:8s} cosine {o['cosine']:.5f} (>= {QUANT_COSINE:g}: "
                         f"quantized model)  max abs {o['max_abs']:.3g}  max rel {o['max_rel']:.3g}  "
                         f"{'ok' if o['ok'] else 'MISMATCH'}")
            continue
        lines.append(f"  {o['name']:10s} {o['dtype']:8s} max abs {o['max_abs']:.3g}  max rel {o['max_rel']:.3g}  "
                     f"(rtol {o['rtol']:g}, atol {o['atol']:g} x max|ref|)  {'ok' if o['ok'] else 'MISMATCH'}")
    b = section.get("bisection")
    if b:
        bad = b.get("first_bad_kernel")
        if bad:
            worst = max(bad["outputs"], key=lambda d: d["max_abs"])
            lines.append(f"  first kernel that differs from its unfused ops: {bad['kernel']} "
                         f"(#{bad['index'] + 1} in execution order, rule {bad.get('rule')}, pattern "
                         f"{bad.get('pattern')}; max abs {worst['max_abs']:.3g})")
            lines.append(f"    source ops: {' + '.join(bad['ops'])}")
        elif "error" in b:
            lines.append(f"  bisection not possible: {b['error']}")
        else:
            lines.append(f"  {b['note']}")
    return "\n".join(lines)
