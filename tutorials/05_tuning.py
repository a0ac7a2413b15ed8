"""Tutorial 5: tune the kernels' tile choices with MetaSchedule, then reuse the records.

What happens:
  1. a LayerNorm -> Linear -> GELU model (W4) is compiled with the rules' own tiles;
  2. ``tvm_ascendfuse.tune.tune_model`` searches other tile choices of the kernels the Matmul and Conv2d
     rules schedule (MetaSchedule, the rule's tile choice as a sampled decision; only tiles that fit UB and
     L1), measures them on this CPU, re-times the fastest beside the default and writes the records to
     ``OUT/<target>/`` (MetaSchedule's JSON database: one workloads file, one records file);
  3. compiling again with ``ASCENDFUSE_SCHEDULES=OUT`` uses the records: the report names the rule
     ``tuned`` where a record won (a kernel whose default stayed fastest keeps it), and the numbers stay
     the same. The same from the shell:
         ascendfuse tune model.onnx --trials 32 -o tuned
         ASCENDFUSE_SCHEDULES=tuned ascendfuse compile model.onnx

Timings are this machine's CPU (host wall clock), not NPU figures; on a shared machine they are noisy,
which is why the tuner re-times its finalists side by side. A progress bar shows trials and the best time
so far on a terminal.

Run:  .venv/bin/python tutorials/05_tuning.py [--rows 128 --hidden 768 --ffn 3072 --trials 16] [--out DIR]
"""

import argparse
import os
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

import tvm_ascendfuse as af
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.schedule.tuned import RECORDS_FILE, SCHEDULES_ENV
from tvm_ascendfuse.tune import tune_model
from tvm_ascendfuse.workloads import ln_linear_gelu


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--ffn", type=int, default=3072)
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--out", default="tutorial_out/tuned")
    args = ap.parse_args()

    model = ln_linear_gelu(rows=args.rows, hidden=args.hidden, ffn=args.ffn)
    mod = import_onnx(model)
    x = np.random.default_rng(0).standard_normal((args.rows, args.hidden)).astype("float32")

    def compile_and_run():
        result = af.compile_model(mod, target="ascend910b")
        out = relax.VirtualMachine(result.executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
        return result, out

    before, y0 = compile_and_run()
    print("rules before tuning:", [k["rule"] for k in before.report.kernels])

    summary = tune_model(model, target="ascend910b", trials=args.trials, output=args.out, log=print)
    print(summary.table())
    print(f"records in {summary.database}")

    os.environ[SCHEDULES_ENV] = str(Path(args.out))
    after, y1 = compile_and_run()
    rules = [k["rule"] for k in after.report.kernels]
    print("rules with the records:", rules)
    err = float(np.max(np.abs(y1 - y0)) / max(float(np.max(np.abs(y0))), 1e-30))   # on the output's scale
    print(f"max |tuned - untuned| / max |untuned| = {err:.2e}")
    good = err < 1e-3 and all(r in ("tuned", b) for r, b in zip(rules, [k["rule"] for k in before.report.kernels]))
    good = good and (Path(summary.database) / RECORDS_FILE).is_file()
    print("tutorial checks: " + ("OK" if good else "FAILED"))
    if not good:
        raise SystemExit(1)


if __name__ == "__main__":
    run()
