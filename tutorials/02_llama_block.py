"""Tutorial 2: a LLaMA decoder block through the Python API, and what the UB fusion switches change.

What happens:
  1. the repo builds a LLaMA-style decoder block as ONNX (RMSNorm, Q/K/V/O projections, causal attention,
     SwiGLU FFN; random weights) and imports it into Relax;
  2. ``tvm_ascendfuse.compile_model`` compiles it three ways: all switches on, without the attention +
     projection kernel, and without any chained GEMM kernel (FFN, attention), each with the traffic table
     (TVM's default fusion and the compulsory lower bound counted on the same model);
  3. for each: the kernels (rule, ops), kernel launches, GM bytes counted on the generated TIR and the
     *modeled* NPU time, then the output checked against ONNX Runtime and one CPU timing (host wall clock,
     not an NPU figure).

The chained kernels keep intermediates on chip but stream their weights once per block of rows (from L2
on the NPU); on a CPU host those re-reads come from DRAM, so "chained GEMMs off" can run faster on the host
while it moves more GM bytes in the NPU model. The report says which is which.

Run:  .venv/bin/python tutorials/02_llama_block.py [--seq 256 --hidden 1024 --heads 16 --ffn 2816]
"""

import argparse
import os
import time

# TVM's runtime counts physical cores; on a VM whose vCPUs are one core's hyperthreads it would use one
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_ascendfuse as af  # noqa: E402
from tvm_ascendfuse.frontend import import_onnx  # noqa: E402
from tvm_ascendfuse.workloads import llama_block  # noqa: E402

CONFIGS = {
    "all on": None,
    "attention + projection off": {"AttentionProjectionFusionPass": "off"},
    "chained GEMMs off": {"AttentionProjectionFusionPass": "off", "ChainedGemmFusionPass": "off"},
}


def cpu_ms(fn, x, rounds=10):
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=2816)
    args = ap.parse_args()

    model = llama_block(seq=args.seq, hidden=args.hidden, heads=args.heads, ffn=args.ffn)
    mod = import_onnx(model)
    x = np.random.default_rng(0).standard_normal((1, args.seq, args.hidden)).astype("float32")

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1          # no ORT worker threads left spinning beside TVM's while we time
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]

    worst = 0.0
    for label, switches in CONFIGS.items():
        result = af.compile_model(mod, target="ascend910b", switches=switches, traffic_baseline=True)
        traffic = result.report.sections["traffic"]
        print(f"== {label}")
        for k in result.report.kernels:
            print(f"   {k.get('rule', '?'):22s} {'+'.join(k.get('ops', []))[:90]}")
        ours, dflt, lb = traffic["ours"], traffic["tvm_default"], traffic["lower_bound"]
        print(f"   launches {ours['launches']} (TVM default {dflt['launches']}); GM MB counted "
              f"{ours['gm_bytes'] / 1e6:.1f} (TVM default {dflt['gm_bytes'] / 1e6:.1f}, lower bound "
              f"{lb['gm_bytes'] / 1e6:.1f}: {ours['gm_bytes'] / lb['gm_bytes']:.3f}x); "
              f"modeled NPU us {ours['modeled_time_us']:.1f}")
        vm = relax.VirtualMachine(result.executable, tvm.cpu())
        xt = tvm.runtime.tensor(x)
        out = vm["main"](xt).numpy()
        err = float(np.max(np.abs(out - ref)))
        worst = max(worst, err)
        print(f"   max |ours - onnxruntime| = {err:.2e}; CPU {cpu_ms(vm['main'], xt):.2f} ms (host, not NPU)\n")
    print(f"all agree with ONNX Runtime within 1e-3: {'OK' if worst < 1e-3 else 'MISMATCH'}")
    if worst >= 1e-3:
        raise SystemExit(1)


if __name__ == "__main__":
    run()
