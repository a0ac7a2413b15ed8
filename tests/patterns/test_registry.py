"""The table as a whole: names, switches, TVM registry publication, priorities."""

from tvm.relax.backend.pattern_registry import get_patterns_with_prefix

import tvm_ascendfuse.patterns as patterns
from tvm_ascendfuse.switches import UB_FUSION, known_switches

SWITCHES = {"TbeConvElemwiseFusionPass", "TbeMatmulElemwiseFusionPass", "TbeLayerNormMatmulFusionPass",
            "TbeAddLayerNormFusionPass", "TbeAddRmsNormFusionPass", "TbeSoftmaxFusionPass",
            "TbeAttentionFusionPass", "TbeSwiGluFusionPass", "TbeEltwiseFusionPass"}


def test_every_pattern_is_published_to_tvm():
    patterns.register_all()
    published = {str(p.name) for p in get_patterns_with_prefix("ascendfuse")}
    ours = {s.name for s in patterns.pattern_table()}
    assert ours <= published, sorted(ours - published)
    assert len(ours) >= 29


def test_names_switches_and_working_sets():
    known = known_switches()
    for spec in patterns.pattern_table():
        fam = spec.name.split(".")[1]
        assert spec.name.startswith("ascendfuse.") and fam in {
            "conv2d", "matmul", "norm", "softmax", "attention", "swiglu", "elementwise"}, spec.name
        assert known[spec.switch].category == UB_FUSION
        assert spec.working_set is not None and spec.checks, spec.name
    assert SWITCHES <= {s.switch for s in patterns.pattern_table()}


def test_longer_chains_are_tried_first():
    order = [s.name for s in patterns.pattern_table()]
    before = [("conv2d.bias_residual_act", "conv2d.bias_act"), ("conv2d.bias_act", "conv2d.bias"),
              ("matmul.bias_act_residual", "matmul.bias_act"), ("attention.scale_mask", "softmax.scale_mask"),
              ("norm.layer_norm_matmul_bias_act", "matmul.bias_act"), ("swiglu.matmul", "matmul.act"),
              ("softmax.scale", "elementwise.chain2"), ("elementwise.chain4", "elementwise.chain2")]
    for a, b in before:
        assert order.index("ascendfuse." + a) < order.index("ascendfuse." + b), (a, b)


def test_every_pattern_has_a_fusion_test():
    """Each declared pattern is the expected kernel pattern of at least one numeric test in this folder."""
    import pathlib
    import re

    text = "".join(p.read_text() for p in pathlib.Path(__file__).parent.glob("test_*.py"))
    tested = set(re.findall(r'"(ascendfuse\.[a-z0-9_]+\.[a-z0-9_]+)"', text))
    missing = sorted({s.name for s in patterns.pattern_table()} - tested)
    assert not missing, missing
