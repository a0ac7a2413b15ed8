"""Compile time per workload: TVM's default Relax pipeline vs ``tvm_ascendfuse.compile_model``.

    python benchmarks/compile_time.py                         # W1..W7, 3 rounds (W2 once)
    python benchmarks/compile_time.py --workloads W4,W6 --rounds 5 --json compile.json

Both compiles target the host with this CPU's features (``mcpu``), as ``fusion_benchmark.py`` does. The two
compiles of a workload alternate inside each round (so a noisy neighbour slows both alike) and the table
shows the minimum over rounds and the ratio ours / default. Nothing is executed. ``compile_model`` runs
without the report-only TVM-default traffic baseline (its default); ``--traffic-baseline`` adds it.
``compile_model`` lowers and code-generates its kernels on the host's cores (``tvm_ascendfuse/build.py``),
TVM's ``tvm.compile`` on one thread; ``--jobs 1`` times ours on one thread too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import tvm
from tvm import relax

import tvm_ascendfuse as af
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.progress import bar
from tvm_ascendfuse.workloads import WORKLOAD_IDS, WORKLOADS

SLOW = {"W2"}   # ResNet-50: one round is enough (seconds per compile)


def time_default(mod, host) -> float:
    t = time.perf_counter()
    tvm.compile(mod, target=host, relax_pipeline=relax.get_default_pipeline(host))
    return time.perf_counter() - t


def time_ours(mod, target, traffic_baseline, jobs=None) -> float:
    t = time.perf_counter()
    af.compile_model(mod, target=target, portable=False, traffic_baseline=traffic_baseline, jobs=jobs)
    return time.perf_counter() - t


def measure(wid: str, target: str, rounds: int, traffic_baseline: bool = False, jobs=None) -> dict:
    mod = import_onnx(WORKLOADS[WORKLOAD_IDS[wid]][0]())
    host = af.get_target(target).host_target(portable=False)
    n = 1 if wid in SLOW else rounds
    default, ours = [], []
    for i in range(n):
        # alternate which one goes first, so neither always runs on a warm cache
        if i % 2 == 0:
            default.append(time_default(mod, host))
            ours.append(time_ours(mod, target, traffic_baseline, jobs))
        else:
            ours.append(time_ours(mod, target, traffic_baseline, jobs))
            default.append(time_default(mod, host))
    d, o = min(default), min(ours)
    return {"workload": wid, "name": WORKLOAD_IDS[wid], "rounds": n, "default_s": round(d, 3),
            "ours_s": round(o, 3), "ratio": round(o / d, 2)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOAD_IDS))
    ap.add_argument("--target", default="ascend910b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--traffic-baseline", action="store_true",
                    help="also compute the report's TVM-default traffic baseline in our compile")
    ap.add_argument("--jobs", type=int, default=None,
                    help="threads for our TIR build (default: the host's cores; 1 = like tvm.compile)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    # warm-up: first compile in a process pays one-time LLVM / registry initialisation
    warm = import_onnx(WORKLOADS[WORKLOAD_IDS["W6"]][0](rows=4, width=32))
    time_default(warm, af.get_target(args.target).host_target(portable=False))
    time_ours(warm, args.target, False, args.jobs)
    rows = []
    print(f"{'':4}{'workload':16}{'default s':>10}{'ours s':>9}{'ours/default':>14}")
    wids = [w.strip() for w in args.workloads.split(",")]
    with bar(total=len(wids), desc="workloads", unit="workload") as shown:
        for wid in wids:
            r = measure(wid, args.target, args.rounds, args.traffic_baseline, args.jobs)
            rows.append(r)
            shown.write(f"{r['workload']:4}{r['name']:16}{r['default_s']:>10.3f}{r['ours_s']:>9.3f}"
                        f"{r['ratio']:>14.2f}", file=sys.stdout)
            shown.update()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
