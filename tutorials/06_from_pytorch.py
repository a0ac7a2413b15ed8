"""Tutorial 6: compile PyTorch models, through ``from_torch`` and through ``ascendfuse compile model.pt2``.

What happens:
  1. a small torchvision-style network (conv-BN-ReLU stem, a residual block, pooling, a linear head),
     written in PyTorch here, goes through ``tvm_ascendfuse.from_torch(model, (x,))``: ``torch.export``, then
     TVM's importer with the weights bound as constants, so graph fusion folds the BatchNorms into the convs;
  2. the compiled model is checked against eager PyTorch (within 1e-4) and its kernels are listed;
  3. a LLaMA-style decoder block (RMSNorm, ``scaled_dot_product_attention`` with ``is_causal``, SwiGLU) is
     saved with ``torch.export.save`` and compiled from the command line with ``--verify`` (against eager
     PyTorch) and ``--html``: the attention arrives as one op and is written out so that it fuses with its
     projections, as in an ONNX export of the same block.

PyTorch is an optional extra (``pip install -e ".[torch]"``); without it this tutorial says so and exits.

Run:  .venv/bin/python tutorials/06_from_pytorch.py [--hw 56 --seq 128 --hidden 512 --heads 8 --ffn 1376] [--out DIR]
"""

import argparse
import sys
from pathlib import Path

try:
    import torch
    from torch import nn
except ImportError:
    print("PyTorch is not installed (pip install -e '.[torch]'); skipping this tutorial")
    sys.exit(0)

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_ascendfuse as af  # noqa: E402
from tvm_ascendfuse.cli import main as ascendfuse  # noqa: E402
from tvm_ascendfuse.workloads.torch_models import llama_block  # noqa: E402


def conv_bn(cin, cout, stride=1):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout))


class TinyResNet(nn.Module):
    def __init__(self, width=32, classes=10):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, width, stride=2), nn.ReLU())
        self.block = nn.Sequential(conv_bn(width, width), nn.ReLU(), conv_bn(width, width))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.block(x) + x)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def trained_looking(model, seed=0):
    """Random weights and BatchNorm statistics that are not the identity (an untrained BN folds to nothing)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5, generator=gen)
                m.bias.uniform_(-0.2, 0.2, generator=gen)
                m.running_mean.uniform_(-0.2, 0.2, generator=gen)
                m.running_var.uniform_(0.5, 2.0, generator=gen)
    return model.eval()


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hw", type=int, default=56)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=1376)
    ap.add_argument("--out", default="tutorial_out/pytorch")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # 1-2. from_torch
    torch.manual_seed(0)
    model = trained_looking(TinyResNet())
    x = torch.randn(1, 3, args.hw, args.hw)
    result = af.compile_model(af.from_torch(model, (x,)), target="ascend910b")
    vm = relax.VirtualMachine(result.executable, tvm.cpu())
    ours = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        eager = model(x).numpy()
    err = float(np.max(np.abs(ours - eager)) / max(float(np.max(np.abs(eager))), 1e-30))   # on the output's scale
    folded = result.report.get("ConvBatchnormFusionPass").effect_times
    print(f"TinyResNet: {len(result.report.kernels)} kernels, {folded} BatchNorms folded into convs")
    for k in result.report.kernels:
        print(f"   {k.get('rule', '?'):10s} {'+'.join(k['ops'])}")
    print(f"   max |ours - eager PyTorch| / max |eager| = {err:.2e}")

    # 3. a saved exported program, from the command line
    block, block_args = llama_block(seq=args.seq, hidden=args.hidden, heads=args.heads, ffn=args.ffn)
    path = out / "llama_block.pt2"
    torch.export.save(torch.export.export(block, block_args), str(path))
    print(f"\nsaved {path}; the same as typing: ascendfuse compile {path} --verify --html -o {out}")
    status = ascendfuse(["compile", str(path), "-o", str(out), "--verify", "--html", "--quiet"])

    good = err < 1e-4 and folded == 3 and status == 0
    print("\ntutorial checks: " + ("OK" if good else "FAILED"))
    if not good:
        raise SystemExit(1)


if __name__ == "__main__":
    run()
