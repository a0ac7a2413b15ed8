"""A float32 model built in 16 bits (CANN's precision modes) against its own float32 build: CPU time, cosine,
modeled GM bytes.

    python benchmarks/precision_benchmark.py resnet50 bert W7 --modes force_fp16,allow_mix_precision,force_bf16
    python benchmarks/precision_benchmark.py W3 --rounds 7 --json prec.json

Arguments as ``model_benchmark.py`` (public-model names, workload ids W1..W7, ONNX files). Per model:

1. **compile**, one process per mode: ``compile_model(mod, "ascend910b", precision_mode=mode)`` (the float32
   build is ``must_keep_origin_dtype``), the library exported, the report's modeled NPU GM bytes and kernel
   rows kept. A mode the target or host cannot build is reported by its error line.
2. **outputs**: each library run once on the same seeded inputs (``profile_kernels.model_inputs``); every
   16-bit build's outputs compared with the float32 build's: cosine and max |a - b| / max |b|.
3. **speed**: every build timed in a fresh process of its own, the builds in turn (fp32, mode 1, mode 2, ...,
   fp32, ...) over ``--rounds`` rounds, each process a warm call then natural-loop calls for ~``--round-ms``;
   each timing process takes ``--lock`` (``flock``) so that only one benchmark runs on the machine at a time.
   The ratio is of the minima over rounds. The load average is recorded before and after.

All times are host-CPU wall clock, not NPU times.
"""

from __future__ import annotations

import os

os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "1000")
os.environ.setdefault("TVM_NUM_THREADS", "2")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FP32 = "must_keep_origin_dtype"
TARGET = "ascend910b"
# not a precision mode: the model converted to fp16 by onnxruntime's ``convert_float_to_float16`` (as a user
# exports an fp16 model), built with its own dtypes
ONNX_FP16 = "onnx_fp16"


def onnx_fp16(onnx_path: Path, work: Path) -> Path:
    """The model converted to fp16 by onnxruntime (inputs and outputs fp16 too), written once into ``work``."""
    out = work / "model_fp16.onnx"
    if not out.exists():
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        onnx.save(convert_float_to_float16(onnx.load(str(onnx_path)), keep_io_types=False), str(out))
    return out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def worker_compile(onnx_path: str, mode: str, lib: str) -> dict:
    import tvm_ascendfuse as af
    from tvm_ascendfuse.frontend import import_onnx

    mod = import_onnx(onnx_path)
    t = time.perf_counter()
    res = af.compile_model(mod, target=TARGET, portable=False, precision_mode=mode)
    out = {"compile_s": time.perf_counter() - t}
    res.executable.export_library(lib)
    traffic = res.report.sections["traffic"]["ours"]
    out["gm_bytes"] = traffic["gm_bytes"]
    out["launches"] = traffic.get("launches")
    out["kernels"] = [{k: r.get(k) for k in ("name", "rule", "ops", "precision", "launches")}
                      for r in res.report.kernels]
    prec = res.report.sections.get("precision") or {}
    out["left_fp32"] = prec.get("left_fp32")
    out["kept_fp32"] = len(prec.get("kept_fp32") or [])
    return out


def worker_time(onnx_path: str, lib: str, round_s: float, min_calls: int, save: str | None,
                int_high: int | None) -> dict:
    import tvm
    from tvm import relax

    from model_benchmark import load_inputs
    from tvm_ascendfuse.frontend import load_onnx

    inputs = load_inputs(load_onnx(onnx_path), 0, int_high)
    vm = relax.VirtualMachine(tvm.runtime.load_module(lib), tvm.cpu())
    fn = vm["main"]
    xs = [tvm.runtime.tensor(a) for a in inputs]
    out = fn(*xs)
    if save:
        arrays = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
        np.savez(save, *arrays)
    times = []
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < round_s:
        t = time.perf_counter()
        fn(*xs)
        times.append(time.perf_counter() - t)
    return {"min_ms": min(times) * 1e3, "median_ms": float(np.median(times)) * 1e3, "calls": len(times)}


def _worker(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--mode", default=FP32)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--round-s", type=float, default=1.0)
    ap.add_argument("--min-calls", type=int, default=5)
    ap.add_argument("--save", default=None)
    ap.add_argument("--int-high", type=int, default=None)
    a = ap.parse_args(argv)
    try:
        if a.worker == "compile":
            res = worker_compile(a.onnx, a.mode, a.lib)
        else:
            res = worker_time(a.onnx, a.lib, a.round_s, a.min_calls, a.save, a.int_high)
    except Exception as err:  # noqa: BLE001 - one line for the parent's table
        from model_benchmark import one_line

        res = {"error": one_line(err), "trace": traceback.format_exc()[-3000:]}
    with open(a.result, "w") as f:
        json.dump(res, f, default=str)
    return 0


def _run(args: list[str], result: str, timeout: float, lock: str | None, log_path: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), *args, "--result", result]
    if lock and shutil.which("flock"):
        cmd = ["flock", lock, *cmd]
    with open(log_path, "a") as err:
        try:
            subprocess.run(cmd, stdout=err, stderr=err, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"timeout {timeout:.0f} s"}
    if not os.path.exists(result):
        return {"error": "worker died (see its log)"}
    with open(result) as f:
        return json.load(f)


def loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def agreement(ref: list[np.ndarray], got: list[np.ndarray]) -> dict:
    cos, rel = 1.0, 0.0
    for a, b in zip(got, ref):
        a = np.asarray(a, np.float64).ravel()
        b = np.asarray(b, np.float64).ravel()
        denom = np.linalg.norm(a) * np.linalg.norm(b)
        cos = min(cos, float(a @ b / denom) if denom > 0 else float(np.array_equal(a, b)))
        scale = np.max(np.abs(b)) if b.size else 0.0
        rel = max(rel, float(np.max(np.abs(a - b)) / scale) if scale > 0 else 0.0)
    return {"cosine": cos, "max_rel": rel}


def bench_model(arg: str, modes: list[str], opts) -> dict:
    from model_benchmark import resolve

    label, onnx_path, _ = resolve(arg, None)
    int_high = None
    work = Path(opts.workdir) / label
    work.mkdir(parents=True, exist_ok=True)
    row = {"model": label, "modes": {}}
    builds = [FP32, *modes]
    sources = {m: (onnx_fp16(onnx_path, work) if m == ONNX_FP16 else onnx_path) for m in builds}
    for mode in builds:
        lib = str(work / f"{mode}.so")
        meta = work / f"{mode}.json"
        if opts.reuse and meta.exists() and os.path.exists(lib):
            res = json.load(open(meta))
        else:
            log(f"[{label}] compile {mode}")
            res = _run(["--worker", "compile", "--onnx", str(sources[mode]),
                        "--mode", FP32 if mode == ONNX_FP16 else mode, "--lib", lib],
                       str(meta), opts.compile_timeout, None, str(work / "compile.log"))
        res["lib"] = lib
        row["modes"][mode] = res
        if "error" in res:
            log(f"[{label}] {mode}: {res['error']}")
    ok = [m for m in builds if "error" not in row["modes"][m]]
    if FP32 not in ok:
        return row
    times = {m: [] for m in ok}
    row["loadavg_before"] = loadavg()
    for r in range(opts.rounds):
        for m in ok:
            save = str(work / f"out_{m}.npz") if r == 0 else None
            args = ["--worker", "time", "--onnx", str(sources[m]), "--lib", row["modes"][m]["lib"],
                    "--round-s", str(opts.round_ms / 1e3)]
            if save:
                args += ["--save", save]
            res = _run(args, str(work / f"time_{m}_{r}.json"), opts.run_timeout, opts.lock, str(work / "run.log"))
            if "error" in res:
                log(f"[{label}] {m} round {r}: {res['error']}")
                continue
            times[m].append(res["min_ms"])
        log(f"[{label}] round {r}: " + ", ".join(f"{m} {t[-1]:.2f}" for m, t in times.items() if t))
    row["loadavg_after"] = loadavg()
    if not (work / f"out_{FP32}.npz").exists():
        for m in ok:
            row["modes"][m]["gm_ratio"] = row["modes"][m]["gm_bytes"] / row["modes"][FP32]["gm_bytes"]
        return row
    ref = list(np.load(work / f"out_{FP32}.npz").values())
    base = min(times[FP32]) if times[FP32] else None
    for m in ok:
        entry = row["modes"][m]
        entry["min_ms"] = min(times[m]) if times[m] else None
        entry["times_ms"] = times[m]
        if base and entry["min_ms"]:
            entry["time_ratio"] = entry["min_ms"] / base
        entry["gm_ratio"] = entry["gm_bytes"] / row["modes"][FP32]["gm_bytes"]
        if m != FP32 and (work / f"out_{m}.npz").exists():
            entry.update(agreement(ref, list(np.load(work / f"out_{m}.npz").values())))
    return row


def table(rows: list[dict]) -> str:
    lines = [f"{'model':10s} {'mode':24s} {'ms':>8s} {'t/fp32':>7s} {'cosine':>9s} {'max_rel':>8s} "
             f"{'GM MB':>8s} {'GM/fp32':>7s}"]
    for row in rows:
        for m, e in row["modes"].items():
            if "error" in e:
                lines.append(f"{row['model']:10s} {m:24s} error: {e['error'][:80]}")
                continue
            ms = f"{e['min_ms']:8.2f}" if e.get("min_ms") else f"{'-':>8s}"
            tr = f"{e['time_ratio']:7.2f}" if e.get("time_ratio") else f"{'-':>7s}"
            cos = f"{e['cosine']:9.6f}" if "cosine" in e else f"{'-':>9s}"
            rel = f"{e['max_rel']:8.1e}" if "max_rel" in e else f"{'-':>8s}"
            lines.append(f"{row['model']:10s} {m:24s} {ms} {tr} {cos} {rel} {e['gm_bytes'] / 1e6:8.2f} "
                         f"{e['gm_ratio']:7.2f}")
        lines.append(f"{'':10s} loadavg {row.get('loadavg_before')} -> {row.get('loadavg_after')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--worker" in argv:
        return _worker(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--modes", default="force_fp16,allow_mix_precision",
                    help="comma list of precision modes to compare with the float32 build; "
                         f"'{ONNX_FP16}': the model converted to fp16 by onnxruntime, built as it is")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--round-ms", type=float, default=1500.0)
    ap.add_argument("--workdir", default=None, help="libraries and outputs (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="reuse the libraries already in --workdir")
    ap.add_argument("--lock", default="/tmp/ascendfuse-bench.lock",
                    help="flock file each timing process takes ('' for none)")
    ap.add_argument("--compile-timeout", type=float, default=1800.0)
    ap.add_argument("--run-timeout", type=float, default=900.0)
    ap.add_argument("--json", default=None)
    opts = ap.parse_args(argv)
    if opts.workdir is None:
        import tempfile

        opts.workdir = tempfile.mkdtemp(prefix="precision_bench_")
    modes = [m.strip() for m in opts.modes.split(",") if m.strip()]
    rows = []
    for arg in opts.models:
        rows.append(bench_model(arg, modes, opts))
        print(table(rows[-1:]), flush=True)
    print("\n" + table(rows))
    print("CPU wall-clock ms on the host (min over rounds, each build in its own process), not NPU times; "
          "GM bytes of the modeled NPU.")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
