"""Per-kernel CPU profile of a model compiled by tvm_ascendfuse, next to onnxruntime's whole-model time.

    python benchmarks/profile_kernels.py --workloads W2
    python benchmarks/profile_kernels.py --workloads W1,W4 --top 10 --out profile.txt
    python benchmarks/profile_kernels.py --workloads W2 --ort-ops     # + ours vs ORT per conv shape class
    python benchmarks/profile_kernels.py --onnx model.onnx --ort-same-ops   # any ONNX file; + ORT's time for
                                                                           # the ops of each generic kernel

For each workload, in one process: compile with ``tvm_ascendfuse.compile_model``, run the VM once with an
instrument that records every kernel call and its arguments, then time each recorded call on its own (warm,
min over interleaved rounds), so a kernel's time does not include the VM's interpretation. Each row shows
the kernel, the schedule rule the report gives it, its pattern/ops, parameter shapes, CPU ms, share of the
per-kernel sum, and GFLOP/s (FLOPs counted on the unscheduled TIR, ``analysis.traffic``). The whole-model
times of ours and ORT are measured interleaved as well. All times are host-CPU wall clock, not NPU times.

``--onnx`` takes any ONNX file (seeded random inputs: floats standard normal, integers below the model's
recorded vocabulary, ``benchmarks/public_models.py``, else ``--int-high``). ``--ort-same-ops`` adds, for every
kernel on a generic rule (fallback, reduction, elementwise, or none), onnxruntime's time for the same ops:
the kernel's calls matched to a subgraph of the ONNX model by tensor values and that subgraph timed alone
(``benchmarks/ort_same_ops.py`` says how and where matching fails).
"""

from __future__ import annotations

import os

# Before importing tvm (see fusion_benchmark.py): idle TVM workers otherwise spin and slow the next runner.
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "1000")
os.environ.setdefault("TVM_NUM_THREADS", "2")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax, tirx  # noqa: E402

import tvm_ascendfuse as af  # noqa: E402
from tvm_ascendfuse.analysis.traffic import count_primfunc  # noqa: E402
from tvm_ascendfuse.frontend import import_onnx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fusion_benchmark import OrtRunner, VMRunner, interleaved, parse_workloads  # noqa: E402

from tvm_ascendfuse.workloads import WORKLOADS  # noqa: E402

INNER_S = 0.01     # one timing sample of a kernel lasts about this long


@dataclass
class KernelRow:
    name: str
    rule: str
    kind: str          # pattern or ops of the kernel
    shapes: str
    calls: int
    ms: float          # summed over its calls
    flops: float       # summed over its calls
    conv_key: tuple | None = None   # (data shape, OIHW weight shape) of the conv it holds, for ORT matching

    @property
    def gflops(self) -> float:
        return self.flops / (self.ms * 1e-3) / 1e9 if self.ms > 0 else 0.0


GENERIC_RULES = ("fallback", "reduction", "elementwise", "unscheduled")   # rules that know no kernel kind


def _as_list(x) -> list[np.ndarray]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def record_calls(executable, x, kernels: set[str]):
    """Run once; return [(symbol, callable, args)] for every call of a kernel in ``kernels``, in order.
    ``x``: the model input, or the list of its inputs."""
    vm = relax.VirtualMachine(executable, tvm.cpu())
    calls = []

    def instrument(func, symbol, before_run, ret_value, *args):
        if before_run and symbol in kernels:
            calls.append((symbol, func, list(args)))   # holding the args keeps their storage alive
        return 0                                       # VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    vm["main"](*[tvm.runtime.tensor(a) for a in _as_list(x)])
    return calls


def capture_calls(executable, x, plan: dict[str, dict]) -> list[dict]:
    """The values of the kernels' tensors, copied right after each call ran: for a kernel in ``plan``
    ({name: {"n_inputs": [per call, in call order], "const": [per call: one flag per input],
    "max_calls": n}}) one dict {'kernel', 'call', 'inputs' (non-constant only), 'outputs'} per captured call."""
    vm = relax.VirtualMachine(executable, tvm.cpu())
    seen: dict[str, int] = {}
    out = []

    def instrument(func, symbol, before_run, ret_value, *args):
        if before_run or symbol not in plan:
            return 0
        k = seen.get(symbol, 0)
        seen[symbol] = k + 1
        p = plan[symbol]
        if k >= p.get("max_calls", 1 << 30) or k >= len(p["n_inputs"]):
            return 0
        n_in, const = p["n_inputs"][k], p["const"][k]
        arrays = [a.numpy() for a in args if isinstance(a, tvm.runtime.Tensor)]
        out.append({"kernel": symbol, "call": k,
                    "inputs": [a for a, c in zip(arrays[:n_in], const) if not c], "outputs": arrays[n_in:]})
        return 0

    vm.set_instrument(instrument)
    vm["main"](*[tvm.runtime.tensor(a) for a in _as_list(x)])
    return out


def call_plan(mod: tvm.IRModule) -> dict[str, dict]:
    """Per kernel, per call of it in ``main`` (binding order = the VM's call order): the number of tensor
    inputs and which of them are constants (weights, folded constants)."""
    from tvm_ascendfuse.analysis.kernels import _calls
    from tvm_ascendfuse.ir import is_call_tir

    plan: dict[str, dict] = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function) or (func.attrs and "Primitive" in func.attrs):
            continue
        for c in _calls(func.body):
            if is_call_tir(c):
                args = c.args[1].fields if isinstance(c.args[1], relax.Tuple) else [c.args[1]]
                p = plan.setdefault(c.args[0].name_hint, {"n_inputs": [], "const": []})
                p["n_inputs"].append(len(args))
                p["const"].append([isinstance(a, tvm.ir.expr.Constant) for a in args])
    return plan


def model_inputs(model, seed: int = 0, int_high: int | None = None, dim: int = 1) -> list[np.ndarray]:
    """Seeded random inputs for every graph input of an ONNX model: floats standard normal, integers in
    [0, high) with high the vocabulary the export recorded (``public_models.INT_HIGH_KEY``), else
    ``int_high`` (default 2), booleans random; symbolic dimensions set to the size the export recorded for
    them (``public_models.SYMBOLIC_DIMS_KEY``: a decode step's cache length), else ``dim``."""
    from onnx import helper

    meta = {p.key: p.value for p in model.metadata_props}
    high = int(meta.get("ascendfuse.int_input_high", int_high or 2))
    sizes = dict(item.split("=") for item in meta.get("ascendfuse.symbolic_dims", "").split(",") if "=" in item)
    inits = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(seed)
    arrays = []
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else int(sizes.get(d.dim_param, dim)) for d in tt.shape.dim]
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if dtype.kind == "f":
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif dtype.kind in "iu":
            arrays.append(rng.integers(0, high, size=shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.integers(0, 2, size=shape).astype(bool))
        else:
            raise ValueError(f"input '{inp.name}' has dtype {dtype}, which the benchmark cannot generate")
    return arrays


def time_call(func, args, rounds: int) -> float:
    """Min seconds of one call over ``rounds`` samples of ~INNER_S each (the first call warms up)."""
    func(*args)
    t = time.perf_counter()
    func(*args)
    one = max(time.perf_counter() - t, 1e-7)
    number = max(1, int(INNER_S / one))
    best = one
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(number):
            func(*args)
        best = min(best, (time.perf_counter() - t) / number)
    return best


def _shapes(func: tirx.PrimFunc) -> str:
    parts = []
    for p in func.params:
        if isinstance(p.ty, tirx.BufferType):        # a TIR buffer is a Var whose type is a BufferType
            parts.append("x".join(str(int(d)) if isinstance(d, tirx.IntImm) else str(d) for d in p.ty.shape))
    return " ".join(parts)


def _source_func(res, name: str, row: dict):
    """The kernel before scheduling (original weight layout, no padding), else the scheduled one."""
    for mod, key in ((res.fused_module, row.get("source_name", name)), (res.scheduled_module, name)):
        if key in [g.name_hint for g in mod.functions]:
            return mod[mod.get_global_var(key)]
    return None


def conv_key(func) -> tuple | None:
    """(data shape, weight shape) of a conv kernel: the first 4-D parameter followed by an OIHW weight whose
    I equals the data's channels, or a depthwise weight (one input channel, O equal to the data's channels).
    Only used to line our kernels up with ORT's Conv nodes."""
    shapes = [tuple(int(d) for d in p.ty.shape) for p in func.params
              if isinstance(p.ty, tirx.BufferType) and all(isinstance(d, tirx.IntImm) for d in p.ty.shape)]
    for a, b in zip(shapes, shapes[1:]):
        if len(a) == 4 and len(b) == 4 and (b[1] == a[1] or (b[1] == 1 and b[0] == a[1])):
            return a, b
    return None


def ort_node_times(model, x, runs: int = 5) -> list[dict]:
    """onnxruntime's own per-node profile (same session options as the benchmark): one row per node with
    op, (data, weight) shapes and the min over ``runs`` of its kernel time in ms."""
    import json
    import tempfile

    import onnxruntime as ort
    from fusion_benchmark import ORT_THREADS

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = ORT_THREADS
    so.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        so.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        feed = {i.name: a for i, a in zip(sess.get_inputs(), _as_list(x))}
        for _ in range(runs):
            sess.run(None, feed)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    nodes: dict[str, dict] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        shapes = [tuple(next(iter(t.values()))) for t in e["args"].get("input_type_shape", [])]
        row = nodes.setdefault(e["name"], {"op": e["args"].get("op_name", "?"), "ms": float("inf"),
                                           "key": (shapes[0], shapes[1]) if len(shapes) >= 2 else None})
        row["ms"] = min(row["ms"], e["dur"] / 1e3)
    return list(nodes.values())


def compare_with_ort(kernels: list[KernelRow], ort_nodes: list[dict]) -> list[tuple]:
    """Rows (what, ours ms, ORT ms) per conv shape class (data shape, weight shape), then ORT's other ops."""
    ours: dict[tuple, list] = {}
    for k in kernels:
        if k.conv_key is not None:
            entry = ours.setdefault(k.conv_key, [0.0, 0, set()])
            entry[0] += k.ms
            entry[1] += k.calls
            entry[2].add(k.rule)
    theirs: dict[tuple, float] = {}
    other: dict[str, float] = {}
    for n in ort_nodes:
        if n["op"] == "Conv" and n["key"] in ours:
            theirs[n["key"]] = theirs.get(n["key"], 0.0) + n["ms"]
        else:
            other[n["op"]] = other.get(n["op"], 0.0) + n["ms"]
    rows = []
    for key, (ms, calls, rules) in sorted(ours.items(), key=lambda kv: -kv[1][0]):
        (d, w) = key
        kind = "depthwise conv" if w[1] == 1 and d[1] == w[0] > 1 else "conv"
        what = (f"{'/'.join(sorted(rules))} x{calls}: {w[2]}x{w[3]} {kind} {d[1]}->{w[0]} on {d[2]}x{d[3]}")
        rows.append((what, ms, theirs.get(key)))
    rows += [(f"ORT {op} node(s) (ours: inside the conv/pool/matmul kernels above)", None, ms)
             for op, ms in other.items()]
    return rows


def _flops(res, name: str, row: dict) -> float:
    """FLOPs of one launch, counted on the kernel before scheduling (padding would inflate the scheduled one)."""
    for mod, key in ((res.fused_module, row.get("source_name", name)), (res.scheduled_module, name)):
        gv = mod.get_global_var(key) if key in [g.name_hint for g in mod.functions] else None
        if gv is not None:
            try:
                return count_primfunc(mod[gv], key).flops
            except Exception:  # noqa: BLE001 - an uncountable kernel shows no GFLOP/s, the time still counts
                return 0.0
    return 0.0


def static_kernel_info(res) -> dict[str, dict]:
    """What the compile knows about each kernel (JSON-serialisable): rule, pattern/ops, parameter shapes,
    FLOPs of one launch, conv shape key, and per call which inputs are constants (``call_plan``)."""
    rows_by_name = {r["name"]: r for r in res.report.kernels}
    rules = res.report.sections.get("schedules", {})
    notes = res.report.sections.get("schedule_notes", {})
    plan = call_plan(res.scheduled_module)
    info = {}
    for gv, func in res.scheduled_module.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        name = gv.name_hint
        row = rows_by_name.get(name, {})
        src = _source_func(res, name, row)
        info[name] = {"rule": rules.get(name, row.get("rule", "?")),
                      "kind": row.get("pattern") or "+".join(row.get("ops", [])) or "-",
                      "ops": list(row.get("ops", [])), "pattern": row.get("pattern"),
                      "shapes": _shapes(func), "flops": _flops(res, name, row),
                      "conv_key": conv_key(src) if src is not None and "conv2d" in name else None,
                      "notes": list(notes.get(name, [])), **plan.get(name, {"n_inputs": [], "const": []})}
    return info


def profile_executable(executable, x, info: dict[str, dict], rounds: int = 5, log=None) -> list[KernelRow]:
    """Every kernel call of one inference timed on its own (warm, min over ``rounds`` samples), summed per
    kernel, slowest first. ``info``: ``static_kernel_info`` (kernels not in it are not timed)."""
    calls = record_calls(executable, x, set(info))
    timed = []
    for i, (symbol, func, args) in enumerate(calls):
        if log and i % 50 == 0:
            log(f"  kernel call {i + 1}/{len(calls)}")
        timed.append((symbol, time_call(func, args, rounds)))
    return kernel_table(timed, info)


def kernel_table(timed: list[tuple[str, float]], info: dict[str, dict]) -> list[KernelRow]:
    """[(symbol, seconds)] per call -> one row per kernel (calls, ms and FLOPs summed), slowest first."""
    table: dict[str, KernelRow] = {}
    for symbol, sec in timed:
        if symbol not in table:
            k = info[symbol]
            key = k.get("conv_key")
            table[symbol] = KernelRow(symbol, k["rule"], k["kind"], k["shapes"], 0, 0.0, 0.0,
                                      tuple(tuple(s) for s in key) if key else None)
        k = table[symbol]
        k.calls += 1
        k.ms += sec * 1e3
        k.flops += info[symbol]["flops"]
    return sorted(table.values(), key=lambda r: -r.ms)


def in_model_call_times(executable, x, kernels: set[str], rounds: int = 5) -> list[tuple[str, float]]:
    """[(symbol, seconds)] for every call of a kernel in ``kernels``, in call order, each timed where the model
    runs it: inside whole-model runs (an instrument stamps the clock before and after the call), min over
    ``rounds`` runs after two warm ones. Unlike ``profile_executable`` (each call alone, repeated, so its
    inputs and weights sit in the caches of the core that runs it), a call here finds its weights wherever
    the rest of the model left them (DRAM when the model's weights exceed the last-level cache) and its input
    in the cache of the core that wrote it: the time the call costs inside the model."""
    vm = relax.VirtualMachine(executable, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in _as_list(x)]
    run: list[tuple[str, float]] = []
    start = [0]

    def instrument(func, symbol, before_run, ret_value, *a):
        if symbol in kernels:
            if before_run:
                start[0] = time.perf_counter_ns()
            else:
                run.append((symbol, (time.perf_counter_ns() - start[0]) * 1e-9))
        return 0                                       # VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    best: list[tuple[str, float]] | None = None
    for i in range(rounds + 2):
        run.clear()
        vm["main"](*args)
        if i < 2:
            continue
        best = list(run) if best is None else [(s, min(t, u)) for (s, t), (_, u) in zip(best, run)]
    return best or []


def profile_in_model(executable, x, info: dict[str, dict], rounds: int = 5) -> list[KernelRow]:
    """``profile_executable``'s table with each call timed inside the model (``in_model_call_times``)."""
    return kernel_table(in_model_call_times(executable, x, set(info), rounds), info)


def same_ops_rows(model, inputs, executable, info: dict[str, dict], kernels: list[str], max_calls: int = 4,
                  runs: int = 20, log=None) -> dict[str, list[dict]]:
    """ORT's time for the ops of each kernel in ``kernels`` (up to ``max_calls`` calls each), per call:
    ``ort_same_ops.ort_same_ops`` rows grouped by kernel."""
    from ort_same_ops import ort_same_ops

    plan = {k: {"n_inputs": info[k]["n_inputs"], "const": info[k]["const"], "max_calls": max_calls}
            for k in kernels if k in info}
    calls = capture_calls(executable, inputs, plan)
    feeds = {i.name: a for i, a in zip([g for g in model.graph.input
                                        if g.name not in {t.name for t in model.graph.initializer}], inputs)}
    out: dict[str, list[dict]] = {}
    for row in ort_same_ops(model, feeds, calls, runs=runs, log=log):
        out.setdefault(row["kernel"], []).append(row)
    return out


def profile_model(model, label: str, target: str = "ascend910b", rounds: int = 5, seed: int = 0, log=print,
                  ort_ops: bool = False, same_ops: bool = False, int_high: int | None = None, switches=None,
                  precision_mode: str | None = None, in_model: bool = False):
    """Compile one ONNX model, time it whole (ours vs ORT interleaved) and per kernel (each call alone, or
    with ``in_model`` inside whole-model runs: ``profile_in_model``). ``same_ops``: True for
    ORT's time of the ops of each generic-rule kernel, "all" for every kernel's. ``switches``: the fusion
    switches of our build (a switch file's path or anything ``compile_model`` takes). ``precision_mode``: our
    build's (CANN's names, ``precision/modes.py``); ORT runs the model as it is."""
    inputs = model_inputs(model, seed, int_high)
    log(f"[{label}] compiling ...")
    t = time.perf_counter()
    res = af.compile_model(import_onnx(model), target=target, portable=False, switches=switches,
                           precision_mode=precision_mode)
    compile_s = time.perf_counter() - t
    info = static_kernel_info(res)

    log(f"[{label}] whole model: ours vs ORT interleaved ...")
    runners = {"ort": OrtRunner(model, inputs), "ours": VMRunner(res.executable, inputs)}
    per_call = {}
    for k, r in runners.items():
        r()
        t = time.perf_counter()
        r()
        per_call[k] = time.perf_counter() - t
    whole = interleaved(runners, per_call, max(5, 2 * rounds))

    log(f"[{label}] timing each kernel call{' inside the model' if in_model else ''} ...")
    kernels = (profile_in_model(res.executable, inputs, info, max(rounds, 10)) if in_model
               else profile_executable(res.executable, inputs, info, rounds))
    out = {"workload": label, "in_model": in_model, "compile_s": compile_s, "kernels": kernels, "info": info,
           "ours_ms": whole["ours"]["min"] * 1e3, "ort_ms": whole["ort"]["min"] * 1e3,
           "launches": sum(k.calls for k in kernels)}
    if ort_ops:
        log(f"[{label}] onnxruntime per-node profile ...")
        out["vs_ort"] = compare_with_ort(out["kernels"], ort_node_times(model, inputs, max(3, rounds)))
    if same_ops:
        generic = [k.name for k in kernels if same_ops == "all" or k.rule in GENERIC_RULES]
        log(f"[{label}] onnxruntime on the ops of {len(generic)} {'' if same_ops == 'all' else 'generic-rule '}"
            "kernels ...")
        out["same_ops"] = same_ops_rows(model, inputs, res.executable, info, generic)
    return out


def profile_workload(name: str, target: str = "ascend910b", rounds: int = 5, seed: int = 0, log=print,
                     ort_ops: bool = False, same_ops: bool = False):
    return profile_model(WORKLOADS[name][0](), name, target, rounds, seed, log, ort_ops, same_ops)


def format_profile(p: dict, top: int | None = None) -> str:
    total = sum(k.ms for k in p["kernels"]) or 1.0
    by_rule: dict[str, float] = {}
    for k in p["kernels"]:
        by_rule[k.rule] = by_rule.get(k.rule, 0.0) + k.ms
    lines = [f"{p['workload']}: {p['launches']} launches; whole model ours {p['ours_ms']:.2f} ms, ORT "
             f"{p['ort_ms']:.2f} ms (ours/ORT {p['ours_ms'] / p['ort_ms']:.2f}); per-kernel sum {total:.2f} ms; "
             f"compile {p['compile_s']:.1f} s",
             "by rule: " + ", ".join(f"{r} {ms:.2f} ms ({100 * ms / total:.0f}%)"
                                    for r, ms in sorted(by_rule.items(), key=lambda kv: -kv[1])),
             ""]
    head = f"{'#':>3} {'ms':>8} {'share':>6} {'GFLOP/s':>8} {'calls':>5}  {'rule':<12} {'kind':<34} kernel / shapes"
    lines.append(head)
    lines.append("-" * len(head))
    cum = 0.0
    for i, k in enumerate(p["kernels"][:top] if top else p["kernels"], 1):
        cum += k.ms
        lines.append(f"{i:>3} {k.ms:8.3f} {100 * k.ms / total:5.1f}% {k.gflops:8.1f} {k.calls:>5}  {k.rule:<12} "
                     f"{k.kind[:34]:<34} {k.name}  [{k.shapes}]")
    if p.get("vs_ort"):
        how = "each call inside the model" if p.get("in_model") else "each call alone, warm"
        lines += ["", f"per conv class, ours ({how}) vs onnxruntime's node profile (min over runs, inside "
                      "the model):",
                  f"{'ours ms':>8} {'ORT ms':>8} {'ratio':>6}  class"]
        for what, ours, theirs in p["vs_ort"]:
            ratio = f"{ours / theirs:6.2f}" if ours and theirs else "     -"
            lines.append(f"{'-' if ours is None else f'{ours:8.3f}':>8} {'-' if theirs is None else f'{theirs:8.3f}':>8} "
                         f"{ratio}  {what}")
    if p.get("same_ops"):
        lines += ["", "kernels, ours (each call alone, warm) vs onnxruntime on the same ONNX ops "
                      "(subgraph matched by values, node-kernel time; ort_same_ops.py):",
                  f"{'ours ms':>8} {'ORT ms':>8} {'ratio':>6}  kernel: matched calls, ONNX ops"]
        by_name = {k.name: k for k in p["kernels"]}
        for name, rows in p["same_ops"].items():
            lines.append(same_ops_line(by_name[name].ms / by_name[name].calls, rows, name,
                                       p["info"][name]["ops"] if "info" in p else None))
    return "\n".join(lines)


_HEAVY_ONNX = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
_HEAVY_RELAX = ("conv1d", "conv2d", "conv3d", "matmul", "dense")


def overreach(kernel_ops: list[str], onnx_ops: list[str]) -> str | None:
    """Why a matched subgraph cannot be the kernel's ops, or None: it holds more convolutions/products than
    the kernel (up to 3 ONNX products per kernel product: sibling projections are merged into one), which
    happens when an input matched a tensor of equal values that is not the one the kernel reads."""
    import re

    ours = sum(1 for o in kernel_ops if re.sub(r"\d+$", "", o.replace("relax.", "")).startswith(_HEAVY_RELAX))
    theirs = sum(1 for o in onnx_ops if o in _HEAVY_ONNX)
    if theirs > 3 * ours:
        return (f"matched subgraph has {theirs} Conv/MatMul nodes for {ours} in the kernel: an input matched "
                f"a twin tensor upstream")
    return None


def same_ops_summary(ours_ms_per_call: float, rows: list[dict], kernel_ops: list[str] | None = None) -> dict:
    """Matched calls' mean ORT node time vs ours per call; the ops of the first matched call. With the
    kernel's source ops, a subgraph that reaches beyond them (``overreach``) does not count as matched."""
    if kernel_ops is not None:
        rows = [dict(r, unmatched=why) if "node_ms" in r and (why := overreach(kernel_ops, r["onnx_ops"]))
                else r for r in rows]
        rows = [{k: v for k, v in r.items() if k not in ("node_ms",)} if "unmatched" in r else r for r in rows]
    matched = [r for r in rows if "node_ms" in r]
    if not matched:
        return {"ort_ms_per_call": None, "ratio": None, "matched": 0, "captured": len(rows),
                "why": rows[0].get("unmatched") if rows else "no call captured"}
    ort = sum(r["node_ms"] for r in matched) / len(matched)
    return {"ort_ms_per_call": ort, "ort_wall_ms_per_call": sum(r["wall_ms"] for r in matched) / len(matched),
            "ratio": ours_ms_per_call / ort if ort > 0 else None, "matched": len(matched), "captured": len(rows),
            "onnx_ops": matched[0]["onnx_ops"], "ort_nodes": matched[0]["ort_nodes"]}


def same_ops_line(ours_ms_per_call: float, rows: list[dict], name: str, kernel_ops=None) -> str:
    s = same_ops_summary(ours_ms_per_call, rows, kernel_ops)
    if s["ort_ms_per_call"] is None:
        return f"{ours_ms_per_call:8.3f} {'-':>8} {'-':>6}  {name}: unmatched ({s['why']})"
    ratio = f"{s['ratio']:6.2f}" if s["ratio"] else "     -"
    return (f"{ours_ms_per_call:8.3f} {s['ort_ms_per_call']:8.3f} {ratio}  {name}: {s['matched']}/{s['captured']} "
            f"calls, {'+'.join(s['onnx_ops'])[:100]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="W2", help="comma list of W1..W7 or names (default W2)")
    ap.add_argument("--onnx", action="append", default=[], help="profile this ONNX file instead (repeatable)")
    ap.add_argument("--int-high", type=int, default=None,
                    help="integer inputs are drawn from [0, N) when the model does not record its vocabulary")
    ap.add_argument("--ort-same-ops", action="store_true",
                    help="onnxruntime's time for the ops of each generic-rule kernel (ort_same_ops.py)")
    ap.add_argument("--same-ops-all", action="store_true",
                    help="with --ort-same-ops: every kernel, not only the generic-rule ones (ranks the gaps "
                         "of the conv/depthwise/SE kernels too)")
    ap.add_argument("--target", default="ascend910b", help="NPU preset or target file (default ascend910b)")
    ap.add_argument("--rounds", type=int, default=5, help="timing samples per kernel call (min is kept)")
    ap.add_argument("--top", type=int, default=0, help="print only the N slowest kernels (default all)")
    ap.add_argument("--out", help="also write the table to this file")
    ap.add_argument("--ort-ops", action="store_true",
                    help="also profile onnxruntime per node and compare per conv shape class")
    ap.add_argument("--in-model", action="store_true",
                    help="time each kernel call inside whole-model runs (weights and inputs where the model "
                         "leaves them) instead of alone and warm; compares like for like with --ort-ops")
    ap.add_argument("--fusion-switch", default=None,
                    help="our build's fusion switch file (CANN's --fusion_switch_file forms, switches.py)")
    ap.add_argument("--precision-mode", default=None,
                    help="our build's precision mode (CANN's names, e.g. force_fp16); ORT runs the model as it is")
    args = ap.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)   # noqa: E731
    try:
        if args.onnx:
            from tvm_ascendfuse.frontend import load_onnx

            jobs = [(os.path.basename(p), lambda p=p: load_onnx(p)) for p in args.onnx]
        else:
            jobs = [(n, WORKLOADS[n][0]) for n in parse_workloads(args.workloads)]
    except af.AscendFuseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = []
    for label, make in jobs:
        prof = profile_model(make(), label, args.target, args.rounds, log=log, ort_ops=args.ort_ops,
                             same_ops="all" if args.ort_same_ops and args.same_ops_all else args.ort_same_ops,
                             int_high=args.int_high, switches=args.fusion_switch,
                             precision_mode=args.precision_mode, in_model=args.in_model)
        text.append(format_profile(prof, args.top or None))
        print(text[-1], flush=True)
    print("CPU wall-clock ms on the host (min over samples), not NPU times; each kernel timed "
          + ("inside whole-model runs." if args.in_model else "alone and warm."))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
