"""Per-kernel CPU profile of a workload compiled by tvm_ascendfuse, next to onnxruntime's whole-model time.

    python benchmarks/profile_kernels.py --workloads W2
    python benchmarks/profile_kernels.py --workloads W1,W4 --top 10 --out profile.txt
    python benchmarks/profile_kernels.py --workloads W2 --ort-ops     # + ours vs ORT per conv shape class

For each workload, in one process: compile with ``tvm_ascendfuse.compile_model``, run the VM once with an
instrument that records every kernel call and its arguments, then time each recorded call on its own (warm,
min over interleaved rounds), so a kernel's time does not include the VM's interpretation. Each row shows
the kernel, the schedule rule the report gives it, its pattern/ops, parameter shapes, CPU ms, share of the
per-kernel sum, and GFLOP/s (FLOPs counted on the unscheduled TIR, ``analysis.traffic``). The whole-model
times of ours and ORT are measured interleaved as well. All times are host-CPU wall clock, not NPU times.
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


def record_calls(executable, x: np.ndarray, kernels: set[str]):
    """Run once; return [(symbol, callable, args)] for every call of a kernel in ``kernels``, in order."""
    vm = relax.VirtualMachine(executable, tvm.cpu())
    calls = []

    def instrument(func, symbol, before_run, ret_value, *args):
        if before_run and symbol in kernels:
            calls.append((symbol, func, list(args)))   # holding the args keeps their storage alive
        return 0                                       # VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    vm["main"](tvm.runtime.tensor(x))
    return calls


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
    I equals the data's channels. Only used to line our kernels up with ORT's Conv nodes."""
    shapes = [tuple(int(d) for d in p.ty.shape) for p in func.params
              if isinstance(p.ty, tirx.BufferType) and all(isinstance(d, tirx.IntImm) for d in p.ty.shape)]
    for a, b in zip(shapes, shapes[1:]):
        if len(a) == 4 and len(b) == 4 and b[1] == a[1]:
            return a, b
    return None


def ort_node_times(model, x: np.ndarray, runs: int = 5) -> list[dict]:
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
        feed = {sess.get_inputs()[0].name: x}
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
        what = (f"{'/'.join(sorted(rules))} x{calls}: {w[2]}x{w[3]} conv {d[1]}->{w[0]} on {d[2]}x{d[3]}")
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


def profile_workload(name: str, target: str = "ascend910b", rounds: int = 5, seed: int = 0, log=print,
                     ort_ops: bool = False):
    model = WORKLOADS[name][0]()
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(seed).standard_normal(shape).astype("float32")
    log(f"[{name}] compiling ...")
    t = time.perf_counter()
    res = af.compile_model(import_onnx(model), target=target, portable=False)
    compile_s = time.perf_counter() - t
    rows_by_name = {r["name"]: r for r in res.report.kernels}
    rules = res.report.sections.get("schedules", {})
    kernels = {g.name_hint for g, f in res.scheduled_module.functions.items() if isinstance(f, tirx.PrimFunc)}

    log(f"[{name}] whole model: ours vs ORT interleaved ...")
    runners = {"ort": OrtRunner(model, x), "ours": VMRunner(res.executable, x)}
    per_call = {}
    for k, r in runners.items():
        r()
        t = time.perf_counter()
        r()
        per_call[k] = time.perf_counter() - t
    whole = interleaved(runners, per_call, max(5, 2 * rounds))

    log(f"[{name}] timing each kernel call ...")
    calls = record_calls(res.executable, x, kernels)
    table: dict[str, KernelRow] = {}
    for symbol, func, args in calls:
        sec = time_call(func, args, rounds)
        row = rows_by_name.get(symbol, {})
        if symbol not in table:
            kind = row.get("pattern") or "+".join(row.get("ops", [])) or "-"
            src = _source_func(res, symbol, row)
            table[symbol] = KernelRow(symbol, rules.get(symbol, row.get("rule", "?")), kind,
                                      _shapes(res.scheduled_module[symbol]), 0, 0.0, 0.0,
                                      conv_key(src) if src is not None and "conv2d" in symbol else None)
        k = table[symbol]
        k.calls += 1
        k.ms += sec * 1e3
        k.flops += _flops(res, symbol, row)
    out = {"workload": name, "compile_s": compile_s, "kernels": sorted(table.values(), key=lambda r: -r.ms),
           "ours_ms": whole["ours"]["min"] * 1e3, "ort_ms": whole["ort"]["min"] * 1e3, "launches": len(calls)}
    if ort_ops:
        log(f"[{name}] onnxruntime per-node profile ...")
        out["vs_ort"] = compare_with_ort(out["kernels"], ort_node_times(model, x, max(3, rounds)))
    return out


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
        lines += ["", "per conv class, ours (each call alone, warm) vs onnxruntime's node profile (min over runs):",
                  f"{'ours ms':>8} {'ORT ms':>8} {'ratio':>6}  class"]
        for what, ours, theirs in p["vs_ort"]:
            ratio = f"{ours / theirs:6.2f}" if ours and theirs else "     -"
            lines.append(f"{'-' if ours is None else f'{ours:8.3f}':>8} {'-' if theirs is None else f'{theirs:8.3f}':>8} "
                         f"{ratio}  {what}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="W2", help="comma list of W1..W7 or names (default W2)")
    ap.add_argument("--target", default="ascend910b", help="NPU preset or target file (default ascend910b)")
    ap.add_argument("--rounds", type=int, default=5, help="timing samples per kernel call (min is kept)")
    ap.add_argument("--top", type=int, default=0, help="print only the N slowest kernels (default all)")
    ap.add_argument("--out", help="also write the table to this file")
    ap.add_argument("--ort-ops", action="store_true",
                    help="also profile onnxruntime per node and compare per conv shape class")
    args = ap.parse_args(argv)
    try:
        names = parse_workloads(args.workloads)
    except af.AscendFuseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    log = lambda msg: print(msg, file=sys.stderr, flush=True)   # noqa: E731
    text = []
    for name in names:
        text.append(format_profile(profile_workload(name, args.target, args.rounds, log=log, ort_ops=args.ort_ops), args.top or None))
        print(text[-1], flush=True)
    print("CPU wall-clock ms on the host (min over samples), not NPU times; each kernel timed alone and warm.")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
