"""Tutorial 9: ``torch.compile(model, backend="ascendfuse")``: torch tensors in and out, dynamic shapes,
graph breaks.

What happens:
  1. a small transformer encoder layer (LayerNorm, attention, GELU MLP) goes through
     ``torch.compile(..., backend="ascendfuse")``: dynamo traces it, our backend exports the traced graph with
     the weights bound as constants and builds it with ``compile_model``; the compiled module takes and returns
     torch tensors (through DLPack, no copy) and is checked against eager PyTorch (within 1e-4 of the
     output's scale);
  2. the sequence length is marked dynamic (``torch._dynamo.mark_dynamic``): it becomes a symbolic dim of the
     Relax module, so three lengths run on one build (``torch_compile.stats`` counts them);
  3. a ``print`` between two halves is a graph break: dynamo hands over two pieces and each is built;
  4. an op TVM's importer has no converter for (``torch.special.i0``) leaves its piece to eager PyTorch with
     one logged line; the answer is still eager's.

PyTorch is an optional extra (``pip install -e ".[torch]"``); without it this tutorial says so and exits.

Run:  .venv/bin/python tutorials/09_torch_compile.py [--hidden 256 --heads 8 --seq 64]
"""

import argparse
import logging
import sys

try:
    import torch
    from torch import nn
except ImportError:
    print("PyTorch is not installed (pip install -e '.[torch]'); skipping this tutorial")
    sys.exit(0)

import tvm_ascendfuse.torch_compile as tc  # noqa: E402  (importing it registers backend="ascendfuse")


class EncoderLayer(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.out(a.transpose(1, 2).reshape(b, n, d))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


class TwoHalves(nn.Module):
    """A print in the middle: dynamo breaks the graph there."""

    def __init__(self, hidden, heads):
        super().__init__()
        self.first, self.second = EncoderLayer(hidden, heads), EncoderLayer(hidden, heads)

    def forward(self, x):
        x = self.first(x)
        print("   (python between the pieces runs as usual)")
        return self.second(x)


class WithSpecialOp(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)

    def forward(self, x):
        return self.fc(torch.special.i0(self.fc(x).tanh()))


def agree(name, fast, model, x) -> bool:
    with torch.no_grad():
        ours, eager = fast(x), model(x)
    scale = float(eager.abs().max())
    err = float((ours - eager).abs().max())
    ok = isinstance(ours, torch.Tensor) and err <= 1e-4 * scale
    print(f"   {name}: max |ours - eager| = {err:.2e} (output scale {scale:.2f}) {'ok' if ok else 'MISMATCH'}")
    return ok


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args()
    logging.basicConfig(stream=sys.stdout, format="   log: %(name)s: %(message)s", level=logging.WARNING)
    torch.manual_seed(0)
    good = True

    # 1-2. one build for every sequence length
    model = EncoderLayer(args.hidden, args.heads).eval()
    fast = torch.compile(model, backend="ascendfuse", options={"target": "ascend910b"})
    print("1-2. encoder layer, sequence length marked dynamic")
    for n in (args.seq, args.seq // 2 + 3, args.seq * 2):
        x = torch.randn(1, n, args.hidden)
        torch._dynamo.mark_dynamic(x, 1)
        good &= agree(f"seq {n:4d}", fast, model, x)
    print(f"   dynamo called the backend {tc.stats['backend_calls']} time(s); builds: {tc.stats['builds']}")
    good &= tc.stats["backend_calls"] == 1 and tc.stats["builds"] == 1
    (_, result), = tc._CACHE.values()
    print(f"   {len(result.report.kernels)} kernels:")
    for k in result.report.kernels:
        print(f"      {k.get('rule', '?'):18s} {'+'.join(k['ops'])[:90]}")

    # 3. a graph break
    tc.clear_cache()
    print("\n3. a print between two layers")
    halves = TwoHalves(args.hidden, args.heads).eval()
    good &= agree("two pieces", torch.compile(halves, backend="ascendfuse"), halves,
                  torch.randn(1, args.seq, args.hidden))
    print(f"   pieces built: {tc.stats['builds']}")
    good &= tc.stats["builds"] == 2

    # 4. an op the importer cannot translate
    tc.clear_cache()
    print("\n4. torch.special.i0 (no converter in TVM's importer)")
    special = WithSpecialOp(args.hidden).eval()
    good &= agree("eager piece", torch.compile(special, backend="ascendfuse"), special,
                  torch.randn(2, args.hidden))
    good &= tc.stats["eager"] == 1 and tc.stats["builds"] == 0

    print("\ntutorial checks: " + ("OK" if good else "FAILED"))
    if not good:
        raise SystemExit(1)


if __name__ == "__main__":
    run()
