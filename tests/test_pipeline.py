"""The graph-fusion phase inside the whole ascendfuse pipeline: numbers unchanged, passes effective."""

import math

import numpy as np
import pytest
from onnx import helper

from tests.graph_fusion.common import onnx_model
from tests.helpers import assert_same_numbers
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import GRAPH_FUSION_PASSES

RNG = np.random.default_rng(7)
N = helper.make_node


def counts(result, name):
    rec = result.report.get(name)
    return rec.match_times, rec.effect_times


def conv_bn_relu():
    inits = {"W": RNG.standard_normal((8, 3, 3, 3)).astype("float32"), "B": RNG.standard_normal(8).astype("float32"),
             "g": RNG.random(8, "float32") + .5, "b": RNG.standard_normal(8).astype("float32"),
             "m": RNG.standard_normal(8).astype("float32"), "v": RNG.random(8, "float32") + .5}
    nodes = [N("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]), N("BatchNormalization", ["c", "g", "b", "m", "v"],
                                                                     ["n"]), N("Relu", ["n"], ["y"])]
    return import_onnx(onnx_model(nodes, {"x": (1, 3, 8, 8)}, {"y": (1, 8, 8, 8)}, inits))


@pytest.mark.parametrize("state", ["off", "on"])
def test_conv_bn_relu_switch(state):
    result = assert_same_numbers(conv_bn_relu(), switches={"ConvBatchnormFusionPass": state})
    assert counts(result, "ConvBatchnormFusionPass") == (1, 1 if state == "on" else 0)
    fused_ops = [k["ops"] for k in result.report.kernels]
    # off: the BN stays (as BatchnormScaleFusionPass's per-channel multiply-add), not folded into the weights
    assert any("batch_norm" in o or "multiply" in o for o in fused_ops) == (state == "off")


def yolo_stem():
    """Focus -> Conv(+bias) -> BN -> x * Sigmoid(x), as exported by YOLOv5 (opset 13)."""
    inits = {"W": RNG.standard_normal((8, 12, 3, 3)).astype("float32"), "B": RNG.standard_normal(8).astype("float32"),
             "g": RNG.random(8, "float32") + .5, "b": RNG.standard_normal(8).astype("float32"),
             "m": RNG.standard_normal(8).astype("float32"), "v": RNG.random(8, "float32") + .5,
             "ax": np.array([2, 3]), "st": np.array([2, 2]), "e": np.array([1 << 30, 1 << 30])}
    nodes = []
    for i, (a, b) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        inits[f"s{i}"] = np.array([a, b])
        nodes.append(N("Slice", ["x", f"s{i}", "e", "ax", "st"], [f"p{i}"]))
    nodes += [N("Concat", [f"p{i}" for i in range(4)], ["cat"], axis=1),
              N("Conv", ["cat", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
              N("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"]),
              N("Sigmoid", ["n"], ["s"]), N("Mul", ["n", "s"], ["y"])]
    return import_onnx(onnx_model(nodes, {"x": (1, 3, 8, 8)}, {"y": (1, 8, 4, 4)}, inits))


def test_yolo_stem_all_passes():
    result = assert_same_numbers(yolo_stem())
    for name in ("FocusConvFusionPass", "ConvBatchnormFusionPass", "SwishFusionPass"):
        assert counts(result, name) == (1, 1), name
    assert [k["ops"] for k in result.report.kernels] == [["conv2d", "add", "silu"]]


def transformer_mlp():
    """Decomposed LayerNorm (opset 13) -> Gemm -> erf GELU."""
    inits = {"two": np.array(2.0, "float32"), "eps": np.array(1e-5, "float32"), "g": RNG.random(16, "float32"),
             "b": RNG.standard_normal(16).astype("float32"), "W": RNG.standard_normal((32, 16)).astype("float32"),
             "B": RNG.standard_normal(32).astype("float32"), "s2": np.array(math.sqrt(2), "float32"),
             "one": np.array(1.0, "float32"), "half": np.array(0.5, "float32")}
    nodes = [N("ReduceMean", ["x"], ["mu"], axes=[-1]), N("Sub", ["x", "mu"], ["d"]), N("Pow", ["d", "two"], ["d2"]),
             N("ReduceMean", ["d2"], ["var"], axes=[-1]), N("Add", ["var", "eps"], ["ve"]), N("Sqrt", ["ve"], ["sd"]),
             N("Div", ["d", "sd"], ["nrm"]), N("Mul", ["nrm", "g"], ["ng"]), N("Add", ["ng", "b"], ["ln"]),
             N("Gemm", ["ln", "W", "B"], ["h"], transB=1),
             N("Div", ["h", "s2"], ["a"]), N("Erf", ["a"], ["er"]), N("Add", ["er", "one"], ["e1"]),
             N("Mul", ["h", "e1"], ["hm"]), N("Mul", ["hm", "half"], ["y"])]
    return import_onnx(onnx_model(nodes, {"x": (4, 16)}, {"y": (4, 32)}, inits))


def test_transformer_mlp_recognised():
    result = assert_same_numbers(transformer_mlp())
    for name in ("LayerNormFusionPass", "GeluFusionPass"):
        assert counts(result, name) == (1, 1), name
    all_ops = [op for k in result.report.kernels for op in k["ops"]]
    assert "layer_norm" in all_ops and "gelu" in all_ops and "erf" not in all_ops
    # the Gemm's transposed weight is a constant by the time the passes run (constants are folded first)
    assert not any(op.startswith(("transpose", "permute_dims")) for op in all_ops), all_ops


def test_every_pass_is_listed_and_switchable():
    from tvm_ascendfuse.switches import GRAPH_FUSION, known_switches
    names = [cls.switch_name for cls in GRAPH_FUSION_PASSES]
    assert len(set(names)) == len(names) == 33
    assert all(known_switches()[n].category == GRAPH_FUSION for n in names)
    assert names.index("LayerNormFusionPass") < names.index("RMSNormFusionPass")
    assert names.index("FocusConvFusionPass") < names.index("ConvBatchnormFusionPass")
    assert names.index("ConcatSplitFusionPass") < names.index("ConvBatchnormFusionPass")
    # the merge sees the projections before the key pad changes the attention's shapes
    assert names[-4:-2] == ["MatMulSiblingMergeFusionPass", "AttentionKeyPadFusionPass"]
    # the flash-decoding attention reads the grouped-query products as their pass leaves them
    assert names[-2:] == ["GroupedQueryMatmulFusionPass", "IncreFlashAttentionFusionPass"]
    # grouped-query products take their scale on the score as the attention patterns do
    assert names.index("AttentionScaleFusionPass") < names.index("GroupedQueryMatmulFusionPass")
    # BN left after the folds becomes scale/shift; sibling convs merge once their weights and biases are final
    assert names.index("ConvBatchnormFusionPass") < names.index("BatchnormScaleFusionPass") \
        < names.index("ConvSiblingMergeFusionPass")
    # conv branches summed over one input become one conv before the sibling merge could concatenate them
    assert names.index("BatchnormScaleFusionPass") < names.index("ConvBranchSumFusionPass") \
        < names.index("ConvSiblingMergeFusionPass")
    # a pool moves across a 1x1 conv once a folded BN's bias is on the conv, and before the sibling merge
    assert names.index("BatchnormScaleFusionPass") < names.index("PoolConvCommuteFusionPass") \
        < names.index("ConvSiblingMergeFusionPass")
    # one-op attention is written out, and its transposes collapsed, before anything looks for attention
    assert names.index("ScaledDotProductAttentionFusionPass") < names.index("TransposeChainFusionPass") \
        < names.index("MatMulBiasAddFusionPass")


def csp_tail():
    """Two 1x1 convs of one input, Concat, BatchNorm, LeakyRelu (YOLOv4 CSP block tail)."""
    inits = {"Wa": RNG.standard_normal((4, 3, 1, 1)).astype("float32"),
             "Wb": RNG.standard_normal((4, 3, 1, 1)).astype("float32"),
             "g": RNG.random(8, "float32") + .5, "b": RNG.standard_normal(8).astype("float32"),
             "m": RNG.standard_normal(8).astype("float32"), "v": RNG.random(8, "float32") + .5}
    nodes = [N("Conv", ["x", "Wa"], ["ca"]), N("Conv", ["x", "Wb"], ["cb"]), N("Concat", ["ca", "cb"], ["cat"], axis=1),
             N("BatchNormalization", ["cat", "g", "b", "m", "v"], ["n"]), N("LeakyRelu", ["n"], ["y"], alpha=0.1)]
    return import_onnx(onnx_model(nodes, {"x": (1, 3, 8, 8)}, {"y": (1, 8, 8, 8)}, inits))


def test_csp_split_then_fold():
    """BN and the activation move onto the concat's parts; BN folds into both convs; the two convs of one input
    (same window, both + bias + LeakyReLU) then merge into one conv."""
    result = assert_same_numbers(csp_tail())
    assert counts(result, "ConcatSplitFusionPass") == (2, 2)
    assert counts(result, "ConvBatchnormFusionPass") == (2, 2)
    kernels = result.report.kernels
    assert not any("batch_norm" in k["ops"] for k in kernels)
    conv_act = [k for k in kernels if k["ops"][0] == "conv2d" and "leaky_relu" in k["ops"]]
    assert counts(result, "ConvSiblingMergeFusionPass") == (1, 1)
    assert sum(k["launches"] for k in conv_act) == 1, kernels      # conv + bias + act over both parts


def test_gemm_bn_folds_after_transpose_fold():
    """Gemm(transB) -> BatchNormalization: the weight transpose is folded first (by the constant folding in
    front of the passes), then BN into the matmul."""
    inits = {"W": RNG.standard_normal((6, 5)).astype("float32"), "B": RNG.standard_normal(6).astype("float32"),
             "g": RNG.random(6, "float32") + .5, "b": RNG.standard_normal(6).astype("float32"),
             "m": RNG.standard_normal(6).astype("float32"), "v": RNG.random(6, "float32") + .5}
    nodes = [N("Gemm", ["x", "W", "B"], ["h"], transB=1), N("BatchNormalization", ["h", "g", "b", "m", "v"], ["y"])]
    result = assert_same_numbers(import_onnx(onnx_model(nodes, {"x": (3, 5)}, {"y": (3, 6)}, inits)))
    assert counts(result, "ConvBatchnormFusionPass") == (1, 1)
    assert [k["ops"] for k in result.report.kernels] == [["matmul", "add"]]


@pytest.mark.parametrize("off,apart", [(None, True), ("ChainedGemmFusionPass", False),
                                       ("AttentionProjectionFusionPass", False), ("CostBasedFusionPass", True)])
def test_sibling_merge_query_apart_given_by_constructor(off, apart):
    """The query projection is left apart only when the attention kernel can take it (both switches on)."""
    from tvm_ascendfuse.pipeline import graph_fusion_phase
    from tvm_ascendfuse.report import FusionReport
    from tvm_ascendfuse.switches import resolve_switches
    from tvm_ascendfuse.target import get_target

    passes = graph_fusion_phase(get_target("ascend910b"), resolve_switches({off: "off"} if off else None),
                                FusionReport())
    [merge] = [p for p in passes if p.info.name == "MatMulSiblingMergeFusionPass"]
    assert merge.query_apart is apart
