"""Tuned vs untuned, side by side in one process: the same model compiled without and with a schedule
database (``ascendfuse tune`` output), timed with interleaved rounds on this CPU (nothing here is an NPU time).

    ascendfuse workload ln_linear_gelu -o w4.onnx        # or conv_bn_relu (W1): conv kernels tune too
    ascendfuse tune w4.onnx --trials 32 -o tuned
    python benchmarks/tuned_vs_untuned.py w4.onnx tuned [--rounds 200]

Threads: TVM_NUM_THREADS (default 2); compare single-threaded (TVM_NUM_THREADS=1) on a shared machine.
"""

from __future__ import annotations

import os

os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "1000")   # as fusion_benchmark.py: idle workers stop spinning
os.environ.setdefault("TVM_NUM_THREADS", "2")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from tvm_ascendfuse import compile_model  # noqa: E402
from tvm_ascendfuse.frontend import import_onnx  # noqa: E402
from tvm_ascendfuse.schedule.tuned import SCHEDULES_ENV  # noqa: E402


def compile_with(mod, target: str, schedules: str | None):
    """Compile with ``schedules`` as the database folder (None: a folder without one, i.e. the rules)."""
    old = os.environ.get(SCHEDULES_ENV)
    os.environ[SCHEDULES_ENV] = schedules if schedules is not None else os.devnull
    try:
        return compile_model(mod, target=target)
    finally:
        if old is None:
            os.environ.pop(SCHEDULES_ENV, None)
        else:
            os.environ[SCHEDULES_ENV] = old


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("schedules", help="folder holding <target>/<cpu>/database_*.json (ascendfuse tune -o)")
    p.add_argument("--target", default="ascend910b")
    p.add_argument("--rounds", type=int, default=200)
    args = p.parse_args()
    mod = import_onnx(args.model)
    runs = {}
    for label, folder in (("untuned", None), ("tuned", args.schedules)):
        result = compile_with(mod, args.target, folder)
        rules = result.report.sections.get("schedules", {})
        print(f"{label:8s} rules: {rules}")
        vm = relax.VirtualMachine(result.executable, tvm.cpu())
        runs[label] = vm
    rng = np.random.default_rng(0)
    inputs = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape]).astype(str(p.ty.dtype)))
              for p in mod["main"].params]
    outs = {k: vm["main"](*inputs).numpy() for k, vm in runs.items()}
    scale = float(np.max(np.abs(outs["untuned"])))   # relative to the output's own scale
    np.testing.assert_allclose(outs["tuned"], outs["untuned"], rtol=1e-4, atol=1e-4 * scale)
    times = {k: [] for k in runs}
    for _ in range(args.rounds):                    # interleaved: a noisy neighbour hurts both alike
        for k, vm in runs.items():
            t0 = time.perf_counter()
            vm["main"](*inputs)
            times[k].append(time.perf_counter() - t0)
            time.sleep(0.002)
    for k, ts in times.items():
        print(f"{k:8s} min {1e3 * min(ts):.3f} ms   median {1e3 * float(np.median(ts)):.3f} ms")
    print(f"tuned/untuned: min {min(times['tuned']) / min(times['untuned']):.3f}   "
          f"median {np.median(times['tuned']) / np.median(times['untuned']):.3f}   (outputs agree)")


if __name__ == "__main__":
    main()
