"""The FFN (up-projection -> activation -> down-projection, + residual) built twice by ``compile_model``: with
the chained-GEMM kernel whatever the host costs (``ChainedGemmHostCost`` off: the NPU model's answer) and as
two GEMM kernels (``ChainedGemmFusionPass`` off); both executables timed on this host in turns (chain, split,
chain, ...; min over rounds). The last column is what the default build (host-aware chain decision) does.

    python benchmarks/chain_vs_split.py                       # ViT-B/16, BERT-base, LLaMA-style shapes
    python benchmarks/chain_vs_split.py --shape 197,768,3072,gelu --rounds 20

Host wall-clock times, never NPU times; on a shared machine compare only the two columns of one run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op

from tvm_ascendfuse.api import compile_model

SHAPES = {  # rows, model width, FFN width, activation
    "vit_b_16": (197, 768, 3072, "gelu"),
    "bert": (128, 768, 3072, "gelu"),
    "llama": (256, 1024, 2816, "swiglu"),
}


def ffn_module(m: int, k: int, f: int, act: str, seed: int = 0) -> tuple[tvm.IRModule, np.ndarray]:
    rng = np.random.default_rng(seed)

    def const(*shape):
        return relax.const((rng.standard_normal(shape) / np.sqrt(shape[0])).astype("float32"))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            if act == "swiglu":
                h = bb.emit(op.multiply(op.nn.silu(op.matmul(x, const(k, f))), op.matmul(x, const(k, f))))
                y = bb.emit(op.add(op.matmul(h, const(f, k)), x))
            else:
                h = bb.emit(op.nn.gelu(op.add(op.matmul(x, const(k, f)), const(f))))
                y = bb.emit(op.add(op.add(op.matmul(h, const(f, k)), const(k)), x))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal((m, k)).astype("float32")


def build(mod, chain: bool):
    res = compile_model(mod, switches={"ChainedGemmHostCost": "off"} if chain else {"ChainedGemmFusionPass": "off"})
    vm = relax.VirtualMachine(res.executable, tvm.cpu())
    return vm, res.report


def time_pair(vms, x, rounds: int, calls: int):
    xs = tvm.runtime.tensor(x)
    best = [float("inf")] * len(vms)
    for vm in vms:
        vm["main"](xs)
    for _ in range(rounds):
        for i, vm in enumerate(vms):
            t0 = time.perf_counter()
            for _ in range(calls):
                vm["main"](xs)
            best[i] = min(best[i], (time.perf_counter() - t0) / calls * 1e3)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", help="rows,width,ffn,act (act gelu or swiglu)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    shapes = ({s: tuple(int(v) if v.isdigit() else v for v in s.split(",")) for s in args.shape}
              if args.shape else SHAPES)
    print(f"{'shape':>24} {'chain ms':>9} {'split ms':>9} {'chain/split':>11}  decision")
    for name, (m, k, f, act) in shapes.items():
        mod, x = ffn_module(m, k, f, act)
        (vc, _), (vs, _) = build(mod, True), build(mod, False)
        a = vc["main"](tvm.runtime.tensor(x)).numpy()
        b = vs["main"](tvm.runtime.tensor(x)).numpy()
        err = float(np.max(np.abs(a - b)) / max(1e-30, float(np.max(np.abs(b)))))
        tc, ts = time_pair([vc, vs], x, args.rounds, args.calls)
        default = compile_model(mod).report
        refused = [d["why"] for d in default.get("CostBasedFusionPass").not_effective
                   if "on this host" in str(d.get("why", ""))]
        print(f"{name:>24} {tc:9.3f} {ts:9.3f} {tc / ts:11.3f}  rel err {err:.1e}; "
              f"default: {'two GEMMs: ' + refused[0] if refused else 'chained'}")


if __name__ == "__main__":
    main()
