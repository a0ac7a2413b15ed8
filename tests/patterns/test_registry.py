"""The table as a whole: names, switches, TVM registry publication, priorities."""

from tvm.relax.backend.pattern_registry import get_patterns_with_prefix

import tvm_ascendfuse.patterns as patterns
from tvm_ascendfuse.switches import UB_FUSION, known_switches

SWITCHES = {"TbeConvElemwiseFusionPass", "TbeMatmulElemwiseFusionPass", "TbeLayerNormMatmulFusionPass",
            "TbeAddLayerNormFusionPass", "TbeAddRmsNormFusionPass", "TbeSoftmaxFusionPass",
            "TbeAttentionFusionPass", "TbeSwiGluFusionPass", "TbeEltwiseFusionPass", "TbeSqueezeExciteFusionPass"}


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
            "conv2d", "matmul", "norm", "softmax", "attention", "swiglu", "elementwise", "squeeze_excite"}, spec.name
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


def test_matmul_working_set_arithmetic():
    """The bytes a refusal records are the documented sum: fp32 matmul + bias + relu, one 16x16x16 step:
    A, B, accumulator, matmul result, add result, bias slice (16 floats = 64 B), relu result = 6 KiB + 64,
    doubled for double buffering = 12416 B. With an 8 KiB UB that is an ub_overflow."""
    from tvm import relax

    from tests.patterns.util import build, const
    from tvm_ascendfuse.grouping import PatternFusionPass
    from tvm_ascendfuse.report import FusionReport
    from tvm_ascendfuse.target import make_target

    mod = build([("x", (64, 64), "float32"), ("w", (64, 64), "float32")],
                lambda bb, x, w: relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w)),
                                                                       const((64,))))))
    report = FusionReport()
    PatternFusionPass(make_target("ascend910b", ub_bytes=8192, ub_reserved_bytes=0), report)(mod)
    recs = report.get("TbeMatmulElemwiseFusionPass").not_effective
    first = next(r for r in recs if r["pattern"] == "ascendfuse.matmul.bias_act")
    assert first["reason"] == "ub_overflow" and first["bytes_needed"] == 2 * (6 * 1024 + 64), recs
    assert first["bytes_available"] == 8192
