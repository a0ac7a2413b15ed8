"""ConvBranchSumFusionPass: a sum of conv branches (+ identity/affine) over one input becomes one conv."""

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from tests.graph_fusion.common import assert_same_after, assert_switched_off, onnx_model, ops, run_ort, run_pass
from tests.helpers import assert_close, tol
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import BatchnormScaleFusionPass, ConvBatchnormFusionPass
from tvm_ascendfuse.graph_fusion import ConvBranchSumFusionPass as P

RNG = np.random.default_rng(28)


def block_onnx(c=4, cout=None, hw=6, kernels=(3, 1), groups=1, stride=1, identity="bn", pads=None,
               strides=None, shared=None):
    """Training-form RepVGG/MobileOne block: ``sum_i BN_i(conv_i(x))`` (+ ``BN(x)`` or ``x``).

    ``pads`` / ``strides``: per-branch overrides (ONNX pads, stride); ``shared``: index of a branch whose BN
    output is also a second model output."""
    cout = cout or c
    inits, nodes, terms = {}, [], []

    def bn(name, src, n):
        for p, v in (("g", RNG.random(n) + .5), ("b", RNG.standard_normal(n)),
                     ("m", RNG.standard_normal(n) * .2), ("v", RNG.random(n) + .5)):
            inits[f"{name}_{p}"] = v.astype("float32")
        nodes.append(helper.make_node("BatchNormalization", [src] + [f"{name}_{p}" for p in "gbmv"], [name]))

    for i, k in enumerate(kernels):
        kh, kw = (k, k) if isinstance(k, int) else k
        inits[f"W{i}"] = RNG.standard_normal((cout, c // groups, kh, kw)).astype("float32")
        pad = pads[i] if pads else [kh // 2, kw // 2] * 2
        st = strides[i] if strides else stride
        nodes.append(helper.make_node("Conv", ["x", f"W{i}"], [f"c{i}"], pads=pad, strides=[st, st], group=groups))
        bn(f"n{i}", f"c{i}", cout)
        terms.append(f"n{i}")
    if identity == "bn":
        bn("nid", "x", c)
        terms.append("nid")
    elif identity == "x":
        terms.append("x")
    acc = terms[0]
    for i, t in enumerate(terms[1:]):      # accumulated as timm's forward does: out = a + b; out += c ...
        nodes.append(helper.make_node("Add", [acc, t], [f"s{i}"]))
        acc = f"s{i}"
    nodes.append(helper.make_node("Relu", [acc], ["y"]))
    k0 = kernels[0] if isinstance(kernels[0], int) else kernels[0][0]
    ho = (hw + sum((pads[0] if pads else [k0 // 2] * 4)[::2]) - k0) // (strides[0] if strides else stride) + 1
    outs = {"y": (2, cout, ho, ho)}
    if shared is not None:
        outs[f"n{shared}"] = (2, cout, ho, ho)
    return onnx_model(nodes, {"x": (2, c, hw, hw)}, outs, inits)


def folded(model):
    """The module as the pass sees it in the pipeline: BNs on convs folded, the BN of x made x * s + t."""
    mod = import_onnx(model)
    mod, _ = run_pass(ConvBatchnormFusionPass, mod)
    mod, _ = run_pass(BatchnormScaleFusionPass, mod)
    return mod


def dce(mod):
    return relax.transform.DeadCodeElimination()(mod)


@pytest.mark.parametrize("kw", [
    dict(kernels=(3, 1), identity="bn"),                          # RepVGG: 3x3 + 1x1 + BN(x), groups 1
    dict(kernels=(3, 1), identity="x"),                           # identity without a BN
    dict(c=6, kernels=(3, 3, 3, 3, 1), groups=6, identity="bn"),  # MobileOne depthwise stage
    dict(c=6, kernels=(1, 1, 1, 1), identity="bn"),               # MobileOne pointwise stage
    dict(c=4, cout=8, hw=8, kernels=(3, 1), stride=2, identity=None),   # stride-2 block, no identity
    dict(c=4, kernels=(5, 3, 1), identity="bn"),                  # three kernel sizes, nested centring
    dict(c=4, kernels=(3, (1, 3), (3, 1)), identity="bn"),        # ACNet: square + horizontal + vertical
], ids=["repvgg", "plain_identity", "depthwise", "pointwise", "stride2", "5x5_3x3_1x1", "acnet"])
def test_branches_become_one_conv(kw):
    model = block_onnx(**kw)
    mod = folded(model)
    assert ops(mod).count("nn.conv2d") == len(kw["kernels"])
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1, rec.to_dict()
    out = dce(out)
    assert ops(out).count("nn.conv2d") == 1, ops(out)
    assert "multiply" not in ops(out)        # the affine branch is inside the kernel
    got, inputs = assert_same_after(import_onnx(model), out)
    assert_close(got, run_ort(model, inputs), **tol("float32"))


def test_other_summands_kept():
    """conv_a(x) + conv_b(x) + conv_c(y) + z + 1: the two branches over x merge, the rest is still added."""
    def body(bb, x, y, z):
        w = lambda: relax.const(RNG.standard_normal((4, 4, 3, 3)).astype("float32"))
        ca, cb, cc = (bb.emit(relax.op.nn.conv2d(t, w(), padding=[1, 1])) for t in (x, x, y))
        s = bb.emit(relax.op.add(ca, cc))
        s = bb.emit(relax.op.add(s, z))
        s = bb.emit(relax.op.add(cb, s))
        return bb.emit(relax.op.add(s, relax.const(np.float32(1.0))))

    from tests.graph_fusion.common import build
    mod = build(body, (1, 4, 5, 5), (1, 4, 5, 5), (1, 4, 5, 5))
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1, rec.to_dict()
    assert ops(dce(out)).count("nn.conv2d") == 2
    assert_same_after(mod, out)


def test_branch_used_elsewhere_refused():
    """A branch's value is also a model output: it has to be computed anyway, so nothing merges."""
    model = block_onnx(kernels=(3, 3, 1), shared=0)
    mod = folded(model)
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 0
    assert "also used outside the sum" in rec.not_effective[0]["failed"], rec.to_dict()
    assert ops(dce(out)).count("nn.conv2d") == 3
    assert_same_after(import_onnx(model), out)


def test_different_strides_refused():
    """3x3 stride 2 and 5x5 stride 1 (no padding) both give 4x4 from 8x8, but read different windows."""
    model = block_onnx(hw=8, kernels=(3, 5), pads=[[1] * 4, [0] * 4], strides=[2, 1], identity=None)
    out, rec = run_pass(P, folded(model))
    assert rec.effect_times == 0
    assert "stride" in rec.not_effective[0]["failed"], rec.to_dict()
    assert ops(dce(out)).count("nn.conv2d") == 2


def test_uncentred_padding_refused():
    """A 3x3 padded only at the bottom/right: its taps are not centred on the 1x1's."""
    model = block_onnx(hw=6, kernels=(3, 1), pads=[[0, 0, 2, 2], [0] * 4], identity=None)
    out, rec = run_pass(P, folded(model))
    assert rec.effect_times == 0
    assert "not the centred" in rec.not_effective[0]["failed"], rec.to_dict()
    assert_same_after(import_onnx(model), out)


def test_weight_not_constant_refused():
    """A branch whose weight is a function parameter cannot be summed into a constant kernel."""
    def body(bb, x, w):
        ca = bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1]))
        cb = bb.emit(relax.op.nn.conv2d(x, relax.const(RNG.standard_normal((4, 4, 1, 1)).astype("float32"))))
        return bb.emit(relax.op.add(ca, cb))

    from tests.graph_fusion.common import build
    mod = build(body, (1, 4, 5, 5), (4, 4, 3, 3))
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 0
    assert "not constant" in rec.not_effective[0]["failed"], rec.to_dict()
    assert ops(dce(out)).count("nn.conv2d") == 2


def test_switched_off():
    assert_switched_off(P, folded(block_onnx(kernels=(3, 1))), 1)


def test_torch_mobileone_block_through_compile_model():
    """A MobileOne-style block in training form written in PyTorch (depthwise stage: four 3x3 convs + BN, a
    1x1 conv + BN, a BN of the input; pointwise stage: two 1x1 convs + BN and a BN of the input; ReLU after
    each), exported by torch.onnx (dynamo), compiled by our pipeline: each stage is one conv kernel, and the
    numbers agree with onnxruntime and eager PyTorch."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    from torch import nn
    from tests.helpers import compile_ours, run_vm

    def conv_bn(c, k, groups):
        return nn.Sequential(nn.Conv2d(c, c, k, padding=k // 2, groups=groups, bias=False), nn.BatchNorm2d(c))

    class Stage(nn.Module):
        def __init__(self, c, k, n, groups):
            super().__init__()
            self.kxk = nn.ModuleList(conv_bn(c, k, groups) for _ in range(n))
            self.scale = conv_bn(c, 1, groups) if k > 1 else None
            self.skip = nn.BatchNorm2d(c)

        def forward(self, x):
            out = self.skip(x)
            if self.scale is not None:
                out = self.scale(x) + out
            for branch in self.kxk:
                out = out + branch(x)
            return torch.relu(out)

    torch.manual_seed(0)
    c = 16
    model = nn.Sequential(Stage(c, 3, 4, c), Stage(c, 1, 2, 1))
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):     # trained-looking statistics, not the identity init
            m.running_mean.uniform_(-.5, .5), m.running_var.uniform_(.5, 2), m.weight.data.uniform_(.5, 1.5)
            m.bias.data.uniform_(-.5, .5)
    model.eval()
    x = torch.randn(1, c, 12, 12)
    with torch.no_grad():
        eager = model(x).numpy()
    onnx_model = torch.onnx.export(model, (x,), dynamo=True, verbose=False).model_proto
    result = compile_ours(import_onnx(onnx_model))
    rec = result.report.get(P.switch_name)
    assert rec.effect_times == 2, rec.to_dict()
    conv_kernels = [k for k in result.report.kernels if any(op.startswith("conv2d") for op in k["ops"])]
    assert sum(k["launches"] for k in conv_kernels) == 2, result.report.kernels
    ours = run_vm(result.executable, [x.numpy()])
    sess = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert_close(ours, sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0], **tol("float32"))
    assert_close(ours, eager, **tol("float32"))
