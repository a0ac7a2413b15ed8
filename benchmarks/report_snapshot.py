"""Fusion reports of the built-in workloads with timings removed, written to a folder and compared with another.

A refactor that must not change behaviour is checked with it: take a snapshot before, one after, and diff.

    python benchmarks/report_snapshot.py --out before/              # W1..W7, both NPU presets
    python benchmarks/report_snapshot.py --out after/ --compare before/

Each model goes through the whole pipeline up to the verified, scheduled module (no LLVM code generation),
so the snapshot holds graph fusion, grouping, kernel, schedule-rule and UB-verification results. Keys that
hold wall-clock times are dropped; everything else must match exactly.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

import tvm

import tvm_ascendfuse as af
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.workloads import WORKLOAD_IDS, WORKLOADS

# keys whose values are wall-clock measurements, not decisions
TIMING_KEYS = {"seconds", "compile_seconds", "grouping_s", "compile_to_fusetir_s"}


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def snapshot(wid: str, target: str) -> dict:
    mod = import_onnx(WORKLOADS[WORKLOAD_IDS[wid]][0]())
    npu = af.get_target(target)
    pipeline = af.AscendFusePipeline(npu)
    host = npu.host_target(portable=True)
    with host:
        for _name, passes in pipeline.phases(*pipeline.resolve()):
            if _name == "lowering":
                break
            mod = tvm.transform.Sequential(passes)(mod)
    return _strip(json.loads(json.dumps(pipeline.report.to_dict(), default=str)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOAD_IDS))
    ap.add_argument("--targets", default="ascend910b,ascend310p")
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", default=None, help="folder of an earlier snapshot: print differences")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    differ = 0
    for target in args.targets.split(","):
        for wid in args.workloads.split(","):
            name = f"{wid}_{target}.json"
            text = json.dumps(snapshot(wid, target), indent=1, sort_keys=True) + "\n"
            (out / name).write_text(text)
            if args.compare:
                old = (Path(args.compare) / name).read_text()
                if old != text:
                    differ += 1
                    sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                               f"{args.compare}/{name}", f"{out}/{name}", n=2))
                else:
                    print(f"{name}: identical")
            else:
                print(f"{name}: written")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
