"""Tutorial 3: single passes in your own ``relax.transform`` sequence, and the whole pipeline through
``tvm.compile(..., relax_pipeline="ascendfuse")``.

What happens:
  1. a ResNet basic block (conv+BN+ReLU, conv+BN, residual add, ReLU) is imported from ONNX;
  2. two of our graph-fusion passes go into a plain TVM ``Sequential`` with TVM's own FoldConstant: the
     BatchNorms are folded into the conv weights; the result is still an ordinary Relax module, so TVM's
     default pipeline compiles it (and gives the same numbers);
  3. the whole ascendfuse pipeline runs through TVM's own ``tvm.compile`` by name, then as an
     ``AscendFusePipeline`` object whose ``.report`` says what it did, and with a pass switched off through
     TVM's ``PassContext(disabled_pass=[...])``.

Run:  .venv/bin/python tutorials/03_passes_and_pipeline.py [--hw 56 --channels 64]
"""

import argparse

import numpy as np
import tvm
from tvm import relax

import tvm_ascendfuse as af
from tvm_ascendfuse.analysis import launch_count
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import ConvBatchnormFusionPass, ConvBiasAddFusionPass
from tvm_ascendfuse.workloads import resnet_basic_block


def ops_of(mod):
    names = []
    for block in mod["main"].body.blocks:
        names += [b.value.op.name.replace("relax.", "") for b in block.bindings
                  if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
    return names


def run_vm(executable, x):
    return relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hw", type=int, default=56)
    ap.add_argument("--channels", type=int, default=64)
    args = ap.parse_args()

    mod = import_onnx(resnet_basic_block(channels=args.channels, hw=args.hw))
    x = np.random.default_rng(0).standard_normal((1, args.channels, args.hw, args.hw)).astype("float32")
    host = af.get_target("ascend910b").host_target()
    default = relax.get_default_pipeline(host)
    reference = run_vm(tvm.compile(mod, target=host, relax_pipeline=default), x)
    print("imported ops:", " ".join(ops_of(mod)))

    # 2. Our passes are ordinary tvm.transform.Pass objects: mix them with TVM's.
    seq = tvm.transform.Sequential([ConvBiasAddFusionPass(), ConvBatchnormFusionPass(),
                                    relax.transform.FoldConstant(), relax.transform.DeadCodeElimination()])
    folded = seq(mod)
    print("after ConvBatchnormFusionPass + FoldConstant:", " ".join(ops_of(folded)))
    err = float(np.max(np.abs(run_vm(tvm.compile(folded, target=host, relax_pipeline=default), x) - reference)))
    print(f"  TVM's default pipeline on it: max |diff| = {err:.2e}")

    # 3a. The whole pipeline by name, as TVM's own pipelines are chosen.
    ex = tvm.compile(mod, target=host, relax_pipeline="ascendfuse")
    err_named = float(np.max(np.abs(run_vm(ex, x) - reference)))
    print(f'tvm.compile(..., relax_pipeline="ascendfuse"): max |diff| = {err_named:.2e}')

    # 3b. As an object, to read its report; a pass switched off through TVM's PassContext.
    pipeline = af.AscendFusePipeline("ascend910b")
    ex = tvm.compile(mod, target=host, relax_pipeline=pipeline)
    kernels = launch_count(pipeline.snapshots["verify"])
    print(f"AscendFusePipeline: {kernels} kernels; "
          f"ConvBatchnormFusionPass effect_times {pipeline.report.get('ConvBatchnormFusionPass').effect_times}")
    off = af.AscendFusePipeline("ascend910b")
    with tvm.transform.PassContext(disabled_pass=["ConvBatchnormFusionPass"]):
        ex_off = tvm.compile(mod, target=host, relax_pipeline=off)
    rec = off.report.get("ConvBatchnormFusionPass")
    print(f"with PassContext(disabled_pass=['ConvBatchnormFusionPass']): {launch_count(off.snapshots['verify'])} "
          f"kernels; matches {rec.match_times}, effect_times {rec.effect_times} "
          f"({', '.join(sorted({e['reason'] for e in rec.not_effective}))})")
    err_off = float(np.max(np.abs(run_vm(ex_off, x) - reference)))

    worst = max(err, err_named, err_off)
    good = worst < 1e-3 and "batch_norm" in " ".join(ops_of(mod)) and "batch_norm" not in " ".join(ops_of(folded)) \
        and rec.effect_times == 0 and rec.match_times == 2
    print(f"all agree with TVM's default pipeline within 1e-3 (worst {worst:.2e}): {'OK' if good else 'FAILED'}")
    if not good:
        raise SystemExit(1)


if __name__ == "__main__":
    run()
