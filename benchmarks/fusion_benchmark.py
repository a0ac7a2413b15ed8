"""Side-by-side benchmark: onnxruntime vs TVM's default Relax pipeline vs tvm_ascendfuse, per workload.

    python benchmarks/fusion_benchmark.py                          # all workloads W1..W7
    python benchmarks/fusion_benchmark.py --workloads W1,W4,W6 --json out.json

For each workload, in one process: import the ONNX model, compile it with (a) ``relax.get_default_pipeline``
and (b) ``tvm_ascendfuse.compile_model``, count the kernels each launches (after FuseTIR), time the compiles,
then time onnxruntime (all graph optimisations, 2 intra-op threads, io-binding), TVM default and ours with
*interleaved* repeats (so a noisy neighbour hurts all three alike), and check that the three outputs agree.
CPU times are measured on the host; nothing here is an NPU time.

Adding a column: write ``def gm_bytes(ctx: BenchContext) -> dict`` returning e.g. ``{"gm_bytes_ours": n}`` and
register it with ``add_column("GM MB ours", value_cell("gm_bytes_ours", "{:.1f}"), hook=gm_bytes)``
(see ``BenchContext`` for what a hook can read). ``benchmark_workload`` returns the row dict, so other scripts can
import this file and call it directly.
"""

from __future__ import annotations

import os

# Before importing tvm: idle TVM workers otherwise spin after each parallel call and slow down the next runner
# (onnxruntime measured 3x slower right after a TVM call); see the field guide, section 10.
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "1000")
os.environ.setdefault("TVM_NUM_THREADS", "2")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.backend.cpu_generic import pipeline as cpu_pipeline  # noqa: E402

import tvm_ascendfuse as af  # noqa: E402
from tvm_ascendfuse.analysis import launch_count, launched_kernels  # noqa: E402
from tvm_ascendfuse.frontend import import_onnx  # noqa: E402
from tvm_ascendfuse.progress import bar  # noqa: E402
from tvm_ascendfuse.workloads import WORKLOAD_IDS, WORKLOADS  # noqa: E402

ORT_THREADS = 2
SWITCH_PAUSE_S = 0.03          # let the previous runner's spinning threads go to sleep
# outputs agree when max |out - ORT| <= AGREE_TOL x max |ORT|: relative to the output's own scale, so a small
# output cannot pass a wrong kernel (full-size fp32 reductions reorder sums differently per runtime)
AGREE_TOL = 1e-3


@dataclass
class BenchContext:
    """What a column hook can read about one workload after both compiles."""
    name: str
    model: onnx.ModelProto
    relax_mod: tvm.IRModule                 # imported, before any pipeline
    default_fused: tvm.IRModule             # TVM default pipeline, right after FuseTIR
    ours: "af.api.CompileResult"            # our executable, report and module after UB fusion
    target: "af.AscendTarget"
    host_target: tvm.target.Target
    inputs: list[np.ndarray]
    row: dict[str, Any] = field(default_factory=dict)   # the columns computed so far


# The printed table: (header, cell(row) -> str), in order. Hooks add keys to the row; cells format them.
COLUMNS: list[tuple[str, Callable[[dict], str]]] = []
COLUMN_HOOKS: list[Callable[[BenchContext], dict]] = []


def add_column(header: str, cell: Callable[[dict], str], hook: Callable[[BenchContext], dict] | None = None) -> None:
    """Register a printed column; ``hook(ctx)`` (optional) returns a dict merged into the row and the JSON."""
    COLUMNS.append((header, cell))
    if hook is not None:
        COLUMN_HOOKS.append(hook)


def value_cell(key: str, fmt: str = "{}") -> Callable[[dict], str]:
    return lambda row: "-" if row.get(key) is None else fmt.format(row[key])


def _ms(v):
    return "-" if v is None else f"{v:.3f}" if v < 100 else f"{v:.0f}"


def _pair(a, b, f="{}"):
    return f"{'-' if a is None else f.format(a)}/{'-' if b is None else f.format(b)}"


# ---------------------------------------------------------------------------------------------------------
# Compiling

def default_fused_module(mod: tvm.IRModule, host: tvm.target.Target) -> tvm.IRModule:
    """TVM's default CPU pipeline up to and including FuseTIR: what it would launch."""
    with host:
        passes = [*cpu_pipeline.library_dispatch_passes(host), *cpu_pipeline.legalize_passes(host)]
        return tvm.transform.Sequential(passes)(mod)


def compile_default(mod: tvm.IRModule, host: tvm.target.Target):
    t = time.perf_counter()
    ex = tvm.compile(mod, target=host, relax_pipeline=relax.get_default_pipeline(host))
    return ex, time.perf_counter() - t


def compile_ours(mod: tvm.IRModule, target: str):
    t = time.perf_counter()
    res = af.compile_model(mod, target=target, portable=False)
    return res, time.perf_counter() - t


# ---------------------------------------------------------------------------------------------------------
# Runners: each is a zero-argument callable doing one inference; ``output()`` returns the last result

def _inputs(x) -> list[np.ndarray]:
    """One input array, or a list of them in the model's input order."""
    return list(x) if isinstance(x, (list, tuple)) else [x]


class OrtRunner:
    def __init__(self, model: onnx.ModelProto, x):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = ORT_THREADS
        self.sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.io = self.sess.io_binding()
        for inp, a in zip(self.sess.get_inputs(), _inputs(x)):
            self.io.bind_ortvalue_input(inp.name, ort.OrtValue.ortvalue_from_numpy(a))
        self.io.bind_output(self.sess.get_outputs()[0].name)

    def __call__(self):
        self.sess.run_with_iobinding(self.io)

    def output(self) -> np.ndarray:
        return self.io.copy_outputs_to_cpu()[0]


class VMRunner:
    def __init__(self, executable, x):
        self.vm = relax.VirtualMachine(executable, tvm.cpu())
        self.fn = self.vm["main"]
        self.x = [tvm.runtime.tensor(a) for a in _inputs(x)]
        self.last = None

    def __call__(self):
        self.last = self.fn(*self.x)

    def output(self) -> np.ndarray:
        return self.last.numpy()


def time_one_call(runner) -> float:
    t = time.perf_counter()
    runner()
    return time.perf_counter() - t


def interleaved(runners: dict[str, Callable], per_call: dict[str, float], repeats: int,
                inner_s: float = 0.02) -> dict[str, dict[str, float]]:
    """Round-robin timing. Each round runs each runner ``n`` times (n so one round lasts ~inner_s); returns
    per-call seconds {name: {"min", "median", "repeats", "number"}}."""
    number = {k: max(1, math.ceil(inner_s / max(per_call[k], 1e-6))) for k in runners}
    samples: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(repeats):
        for name, f in runners.items():
            time.sleep(SWITCH_PAUSE_S)
            if per_call[name] < 0.1:
                f()                              # warm: wake the thread pool, touch the weights
            t = time.perf_counter()
            for _ in range(number[name]):
                f()
            samples[name].append((time.perf_counter() - t) / number[name])
    return {k: {"min": min(v), "median": statistics.median(v), "repeats": len(v), "number": number[k]}
            for k, v in samples.items()}


def pick_repeats(per_call: dict[str, float], budget_s: float, lo: int = 3, hi: int = 30,
                 inner_s: float = 0.02) -> int:
    per_round = sum(max(inner_s, t) + (t if t < 0.1 else 0) + SWITCH_PAUSE_S for t in per_call.values())
    return int(max(lo, min(hi, budget_s // max(per_round, 1e-9))))


def agreement(out: np.ndarray | None, ref: np.ndarray) -> dict[str, Any]:
    if out is None:
        return {"agree": None, "max_abs_err": None}
    err = float(np.max(np.abs(out.astype(np.float64) - ref)))
    scale = float(np.max(np.abs(ref)))
    return {"agree": bool(np.all(np.isfinite(out)) and err <= AGREE_TOL * scale), "max_abs_err": err}


# ---------------------------------------------------------------------------------------------------------
# One workload -> one row

def benchmark_workload(name: str, target: str = "ascend910b", budget_s: float = 20.0,
                       max_default_call_s: float = 60.0, time_default: bool = True, min_rounds: int = 3,
                       seed: int = 0, log=print) -> dict[str, Any]:
    """Compile, count, time and compare one workload. Returns the row (JSON-serialisable)."""
    model = WORKLOADS[name][0]()
    npu = af.get_target(target)
    host = npu.host_target(portable=False)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(seed).standard_normal(shape).astype("float32")
    row: dict[str, Any] = {"workload": name, "description": WORKLOADS[name][1], "target": npu.name,
                           "host_target": str(host), "notes": []}

    mod = import_onnx(model)
    log(f"[{name}] compiling with TVM default pipeline ...")
    default_fused = default_fused_module(mod, host)
    ex_default, row["compile_s_default"] = compile_default(mod, host)
    log(f"[{name}] compiling with tvm_ascendfuse ...")
    ours, row["compile_s_ours"] = compile_ours(mod, target)
    row["launches_default"] = launch_count(default_fused)
    row["launches_ours"] = launch_count(ours.fused_module)
    row["kernels_default"] = launched_kernels(default_fused)
    row["kernels_ours"] = launched_kernels(ours.fused_module)

    runners = {"ort": OrtRunner(model, x), "default": VMRunner(ex_default, x), "ours": VMRunner(ours.executable, x)}
    per_call = {}
    for k, r in runners.items():
        if k == "default" and not time_default:
            continue
        per_call[k] = time_one_call(r)         # first call includes lazy init: an upper bound
        if per_call[k] < 1.0:                  # cheap enough to measure a warm call too
            per_call[k] = time_one_call(r)
        log(f"[{name}] one call {k}: {per_call[k] * 1e3:.1f} ms")
    if "default" in per_call and per_call["default"] > max_default_call_s:
        row["notes"].append(f"TVM default not timed: one call took {per_call['default']:.0f} s")
    timed = {k: runners[k] for k in per_call if not (k == "default" and per_call[k] > max_default_call_s)}
    if not time_default:
        row["notes"].append("TVM default not run (--skip-default-timing)")
    repeats = pick_repeats({k: per_call[k] for k in timed}, budget_s, lo=min_rounds)
    log(f"[{name}] timing {list(timed)} interleaved, {repeats} rounds ...")
    times = interleaved(timed, per_call, repeats)
    for k in ("ort", "default", "ours"):
        t = times.get(k)
        row[f"{k}_ms_min"] = t["min"] * 1e3 if t else None
        row[f"{k}_ms_median"] = t["median"] * 1e3 if t else None
        row[f"{k}_rounds"] = f"{t['repeats']}x{t['number']}" if t else None
    row["ours_over_ort"] = (row["ours_ms_min"] / row["ort_ms_min"]) if row["ort_ms_min"] else None

    ref = runners["ort"].output()
    for k in ("default", "ours"):
        got = runners[k].output() if runners[k].last is not None else None
        a = agreement(got, ref)
        row[f"{k}_agrees_with_ort"], row[f"{k}_max_abs_err"] = a["agree"], a["max_abs_err"]

    ctx = BenchContext(name, model, mod, default_fused, ours, npu, host, [x], row)
    for hook in COLUMN_HOOKS:
        row.update(hook(ctx))
    return row


# ---------------------------------------------------------------------------------------------------------
# The table

def _agree(row):
    marks = {True: "ok", False: "DIFF", None: "-"}
    return f"{marks[row.get('default_agrees_with_ort')]}/{marks[row.get('ours_agrees_with_ort')]}"


add_column("workload", value_cell("workload"))
add_column("launches default/ours", lambda r: _pair(r.get("launches_default"), r.get("launches_ours")))
add_column("compile s default/ours", lambda r: _pair(r.get("compile_s_default"), r.get("compile_s_ours"), "{:.1f}"))
add_column("ORT ms", lambda r: _ms(r.get("ort_ms_min")))
add_column("TVM-default ms", lambda r: _ms(r.get("default_ms_min")))
add_column("ours ms", lambda r: _ms(r.get("ours_ms_min")))
add_column("ours/ORT", value_cell("ours_over_ort", "{:.2f}"))
add_column("agree dflt/ours", _agree)


def traffic_columns(ctx: BenchContext) -> dict:
    """Counted GM bytes and *modeled* NPU time of both fusions (tvm_ascendfuse.analysis.traffic), from the
    imported model for TVM default and from our module after FuseTIR. Informative: never fails the run."""
    try:
        from tvm_ascendfuse.analysis.traffic_pass import traffic_table

        t = traffic_table(ctx.relax_mod, ctx.ours.fused_module, ctx.target, ctx.host_target)
    except Exception as err:   # an analysis gap must not lose the measured columns
        ctx.row["notes"].append(f"traffic columns unavailable: {type(err).__name__}: {err}"[:200])
        return {}
    d, o = t["tvm_default"], t["ours"]
    return {"gm_mb_default": d["gm_bytes"] / 1e6, "gm_mb_ours": o["gm_bytes"] / 1e6,
            "gm_mb_lower_bound": t["lower_bound"]["gm_bytes"] / 1e6,
            "modeled_us_default": d["modeled_time_us"], "modeled_us_ours": o["modeled_time_us"]}


def use_traffic_columns() -> None:
    """Add the counted-GM-bytes and modeled-NPU-time columns (main() does unless --no-traffic)."""
    add_column("GM MB dflt/ours (counted)",
               lambda r: _pair(r.get("gm_mb_default"), r.get("gm_mb_ours"), "{:.2f}"), hook=traffic_columns)
    add_column("NPU us dflt/ours (modeled)",
               lambda r: _pair(r.get("modeled_us_default"), r.get("modeled_us_ours"), "{:.0f}"))


def format_table(rows: list[dict]) -> str:
    cells = [[h for h, _ in COLUMNS]] + [[cell(r) for _, cell in COLUMNS] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(line, widths)) for line in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    notes = [f"  {r['workload']}: {n}" for r in rows for n in r.get("notes", [])]
    return "\n".join(lines + (["notes:"] + notes if notes else []))


def parse_workloads(spec: str) -> list[str]:
    if spec.strip().lower() == "all":
        return list(WORKLOADS)
    names = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        name = WORKLOAD_IDS.get(item.upper(), item)
        if name not in WORKLOADS:
            raise af.AscendFuseError(f"unknown workload '{item}'; use W1..W{len(WORKLOADS)} or one of "
                                     f"{', '.join(WORKLOADS)}")
        names.append(name)
    return names


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="all", help="comma list of W1..W7 or names (default all)")
    p.add_argument("--target", default="ascend910b", help="NPU preset or target file (default ascend910b)")
    p.add_argument("--budget", type=float, default=20.0, help="seconds of timing per workload (approximate)")
    p.add_argument("--max-default-call", type=float, default=60.0,
                   help="skip timing TVM default when one call takes longer than this many seconds")
    p.add_argument("--skip-default-timing", default="", help="comma list of workloads not to run with TVM default")
    p.add_argument("--min-rounds", type=int, default=3, help="fewest interleaved timing rounds (default 3)")
    p.add_argument("--no-traffic", action="store_true", help="skip the counted-GM-bytes / modeled-time columns")
    p.add_argument("--json", help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    try:
        names = parse_workloads(args.workloads)
        skip = set(parse_workloads(args.skip_default_timing)) if args.skip_default_timing else set()
    except af.AscendFuseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not args.no_traffic:
        use_traffic_columns()
    log = lambda msg: print(msg, file=sys.stderr, flush=True)   # noqa: E731
    rows = []
    shown = bar(total=len(names), desc="workloads", unit="workload")
    log = lambda msg: shown.write(msg, file=sys.stderr)   # noqa: E731  (printed above the bar)
    for name in names:
        shown.set_postfix_str(name)
        try:
            rows.append(benchmark_workload(name, args.target, args.budget, args.max_default_call,
                                           time_default=name not in skip, min_rounds=args.min_rounds, log=log))
        except af.AscendFuseError as err:     # one workload failing to compile must not lose the others
            rows.append({"workload": name, "description": WORKLOADS[name][1], "error": str(err),
                         "notes": [f"failed: {type(err).__name__}: {err}"]})
        log(format_table(rows[-1:]))
        shown.update()
    shown.close()
    print(format_table(rows))
    print("ms columns: CPU wall-clock on the host (min over interleaved rounds), not NPU times; noisy on a "
          "shared machine. GM bytes are counted on the TIR; NPU us are modeled from the target description.")
    if args.json:
        meta = {"python": platform.python_version(), "tvm": tvm.__version__, "machine": platform.machine(),
                "cpu": tvm.target.codegen.llvm_get_system_cpu(), "ort_threads": ORT_THREADS,
                "env": {k: os.environ.get(k) for k in ("TVM_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT")},
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2, default=str)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
