"""Kernel launches, counted GM bytes and modeled NPU time per workload: TVM default fusion vs ours vs the
compulsory lower bound (inputs + weights + outputs moved once).

    python benchmarks/fusion_traffic.py                    # W1..W7 at benchmark sizes
    python benchmarks/fusion_traffic.py --workloads W2,W3 --json traffic.json

Nothing is executed: each model is taken through our graph-fusion and UB-fusion phases (up to FuseTIR) and
through TVM's default pipeline up to FuseTIR; bytes are counted on the resulting TIR
(``tvm_ascendfuse.analysis.traffic``) and times are *modeled* from the target's bandwidth, peaks and launch
overhead — they are not measurements.
"""

from __future__ import annotations

import argparse
import json
import time

import tvm

import tvm_ascendfuse as af
from tvm_ascendfuse.analysis.traffic_pass import traffic_table
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.pipeline import graph_fusion_phase, ub_fusion_phase
from tvm_ascendfuse.report import FusionReport
from tvm_ascendfuse.switches import resolve_switches
from tvm_ascendfuse.workloads import WORKLOAD_IDS, WORKLOADS


def fuse(mod, npu, host, switches=None):
    """Our pipeline up to and including FuseTIR (no lowering, no codegen)."""
    report, sw = FusionReport(npu.name), resolve_switches(switches)
    with host:
        mod = tvm.transform.Sequential(graph_fusion_phase(npu, sw, report))(mod)
        mod = tvm.transform.Sequential(ub_fusion_phase(npu, sw, report, host))(mod)
    return mod, report


def row(wid: str, npu, host) -> dict:
    name = WORKLOAD_IDS[wid]
    original = import_onnx(WORKLOADS[name][0]())
    t = time.perf_counter()
    fused, report = fuse(original, npu, host)
    seconds = time.perf_counter() - t
    table = traffic_table(original, fused, npu, host)
    table.pop("kernels")
    table.update(workload=wid, name=name, compile_to_fusetir_s=round(seconds, 2),
                 grouping_s=report.sections.get("grouping", {}).get("stats", {}).get("seconds"))
    return table


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOAD_IDS))
    ap.add_argument("--target", default="ascend910b")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    npu = af.get_target(args.target)
    host = npu.host_target(portable=True)
    rows = []
    head = (f"{'':4}{'workload':16}{'launches':>18}{'GM MB (counted)':>26}{'modeled us':>26}"
            f"{'GM/LB':>7}{'group s':>8}")
    print(head)
    print(f"{'':20}{'TVM  ours  LB':>18}{'TVM    ours    LB':>26}{'TVM    ours    LB':>26}")
    for wid in args.workloads.split(","):
        r = row(wid.strip(), npu, host)
        rows.append(r)
        d, o, lb = r["tvm_default"], r["ours"], r["lower_bound"]
        mb = lambda x: x["gm_bytes"] / 1e6
        print(f"{r['workload']:4}{r['name']:16}{d['launches']:>8}{o['launches']:>5}{lb['launches']:>5}"
              f"{mb(d):>12.1f}{mb(o):>7.1f}{mb(lb):>7.1f}"
              f"{d['modeled_time_us']:>12.1f}{o['modeled_time_us']:>7.1f}{lb['modeled_time_us']:>7.1f}"
              f"{r['gm_bytes_vs_lower_bound']:>7.2f}{r['grouping_s'] or 0:>8.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
