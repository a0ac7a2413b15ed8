"""The rule table (``rule_specs.py``) against the schedule phase: the rule it predicts for a kernel, from the
ops' kinds alone, is the rule the schedule phase picks; its order is the schedule phase's order."""

import functools

import numpy as np
import pytest
from tvm import relax
from tvm.relax import op

from tests.analysis.test_ub_usage import SMALL
from tests.grouping.test_chained_gemm_grouping import ffn, swiglu
from tests.helpers import assert_same_numbers, compile_ours
from tests.schedule.test_attention_projection import _decoder_attention
from tests.schedule.test_decode_attention import decode_step
from tests.graph_fusion.test_grouped_query_matmul import gqa_attention
from tests.shape_models import decode_step as cache_length_symbolic_step
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.kinds import op_kind
from tvm_ascendfuse.rule_specs import FALLBACK, RULE_SPECS, GroupShape, group_shape, predict_rule
from tvm_ascendfuse.schedule.apply import DEFAULT_RULES
from tvm_ascendfuse.workloads import WORKLOADS, cnn_blocks


def test_table_order_is_the_schedule_phase_order():
    assert [s.name for s in RULE_SPECS] == [r.name for r in DEFAULT_RULES]


@pytest.mark.parametrize("kinds, chained, rule", [
    ("G", False, "matmul"), ("GEEeLeLE", False, "matmul"), ("RGE", False, "matmul"), ("CEE", False, "conv2d"),
    ("CEEP", False, "pool"), ("CEeME", False, "pool"), ("MECECE", True, "squeeze-excite"),
    ("DEE", False, "depthwise-conv2d"), ("DEeME", False, "depthwise-conv2d"), ("DEP", False, "reduction"), ("DEEER", False, "reduction"),
    ("QEE", False, "grouped-conv2d"), ("QEeME", False, "grouped-conv2d"), ("GEG", True, "chained-matmul"),
    ("GEG", False, "multi-matmul"), ("GERG", True, "attention"), ("GERGLG", True, "attention-projection"),
    ("GER", False, "matmul+norm"), ("LLG", False, "matmul"), ("ER", False, "reduction"), ("EEL", False, "elementwise"),
    ("eRG", False, "matmul"), ("LLLeRGE", False, "matmul"), ("eLP", False, "pool"), ("lCEE", False, "conv2d"),
    ("lQEE", False, "grouped-conv2d"), ("lDEE", False, "fallback"), ("pEEE", False, "fallback"),
    ("DELR", False, "fallback"), ("DEELER", False, "fallback"), ("DELRE", False, "fallback"),
    ("eR", False, "fallback"), ("ErR", False, "fallback"), ("O", False, "fallback"), ("S", False, "recurrence")])
def test_prediction_from_kinds(kinds, chained, rule):
    assert predict_rule(GroupShape(kinds, chained)).name == rule


def test_a_few_rows_per_head_after_a_transpose_are_row_dots():
    """Decode attention's scores over a symbolic cache: (query stacking, Kᵀ) -> batched product of 4 rows."""
    assert predict_rule(GroupShape("LLG", False, rows=4, batched=True)).name == "row-dot"
    assert predict_rule(GroupShape("LLG", False, rows=64, batched=True)).name == "matmul"
    assert predict_rule(GroupShape("GL", False, rows=4, batched=True)).name == "matmul"   # P·V: V read by columns


def test_group_shape_marks_second_outputs_and_chains():
    # op 0 feeds op 1 feeds op 2; op 1's value also leaves the group
    shape = group_shape("GEG", [set(), {0}, {1}], outputs={1, 2})
    assert shape == GroupShape("GeG", True)
    assert group_shape("GEG", [set(), set(), {1}]).chained is False
    assert predict_rule(GroupShape("ErR")) is FALLBACK     # two reductions, both outputs: no rule's form


def _op_kind_of(build, shapes):
    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(*params))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    [prim] = [f for g, f in mod.functions.items() if g.name_hint != "main"]
    return op_kind(prim)


@pytest.mark.parametrize("build, shapes, kind", [
    (lambda x, w: op.nn.conv2d(x, w, padding=1), [(1, 8, 6, 6), (4, 8, 3, 3)], "C"),
    (lambda x, w: op.nn.conv2d(x, w, padding=1, groups=8), [(1, 8, 6, 6), (8, 1, 3, 3)], "D"),
    (lambda x, w: op.nn.conv2d(x, w, padding=1, groups=2), [(1, 8, 6, 6), (8, 4, 3, 3)], "Q"),
    (lambda x, w: op.matmul(x, w), [(4, 8), (8, 16)], "G"),
    (lambda x: op.nn.max_pool2d(x, 3, 2, 1), [(1, 8, 6, 6)], "P"),
    (lambda x: op.mean(x, axis=[2, 3], keepdims=True), [(1, 8, 6, 6)], "M"),
    (lambda x: op.nn.softmax(x, -1), [(4, 8)], "R"),
    (lambda x, y: op.add(x, y), [(4, 8), (4, 8)], "E"),
    (lambda x: op.permute_dims(x, [1, 0]), [(4, 8)], "L")])
def test_op_kind_letters(build, shapes, kind):
    assert _op_kind_of(build, shapes) == kind


def test_recurrent_layer_kernel_is_its_own_kind():
    """The layer kernel the recurrent converters write is ``S`` by its tag (its one opaque block would read as
    layout, predicted elementwise); the same function untagged is not."""
    from tvm_ascendfuse.recurrence_kernel import ATTR, LayerSpec, layer_kernel

    func = layer_kernel(LayerSpec("gru", 3, 1, 32, 16, 2, False), scheduled=False)
    assert op_kind(func) == "S"
    assert op_kind(func.without_attr(ATTR)) != "S"


# ---- the prediction against the schedule phase, kernel by kernel ---------------------------------------------
def _graph(shapes, body):
    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(*params))
        bb.emit_func_output(out)
    return bb.get()


def _conv_two_pools():
    """conv + bias + ReLU + two 3x3 max-pools (an Inception-style stem)."""
    return _graph([(1, 8, 16, 16), (16, 8, 3, 3), (1, 16, 1, 1)], lambda x, w, b: op.nn.max_pool2d(
        op.nn.max_pool2d(op.nn.relu(op.add(op.nn.conv2d(x, w, padding=1), b)), 3, 1, 1), 3, 2, 1))


def _grouped_conv():
    """grouped conv (2 groups, 8 -> 16 channels) + bias + ReLU, then a 1x1 conv."""
    return _graph([(1, 8, 10, 10), (16, 4, 3, 3), (1, 16, 1, 1), (8, 16, 1, 1)], lambda x, w, b, w2: op.nn.conv2d(
        op.nn.relu(op.add(op.nn.conv2d(x, w, padding=1, groups=2), b)), w2))


def _softmax():
    """a row softmax of a sum: the reduction rule."""
    return _graph([(16, 64), (16, 64)], lambda x, y: op.nn.softmax(op.add(x, y), -1))


def _elementwise():
    return _graph([(16, 64), (16, 64)], lambda x, y: op.nn.relu(op.multiply(op.add(x, y), y)))


def _onnx(name):
    return lambda: import_onnx(WORKLOADS[name][0](**SMALL[name]))


OFF_HOST = {"ChainedGemmHostCost": "off"}
CASES = {
    # name: (module, switches, rules the case must show)
    "W1": (_onnx("conv_bn_relu"), None, {"conv2d"}),
    "W2": (_onnx("resnet50"), None, {"conv2d", "pool"}),
    "W3": (_onnx("bert_layer"), None, set()),
    "W4": (_onnx("ln_linear_gelu"), None, {"matmul"}),
    "W5": (_onnx("focus_conv"), None, {"conv2d"}),
    "W6": (_onnx("mlp3"), None, {"matmul"}),
    "W7": (_onnx("llama_block"), None, {"attention-projection"}),
    "squeeze_excite": (lambda: import_onnx(cnn_blocks.squeeze_excite_block(channels=16, hw=14)), None,
                       {"squeeze-excite", "depthwise-conv2d"}),
    "squeeze_excite_linear": (lambda: import_onnx(cnn_blocks.squeeze_excite_block(channels=16, hw=14, fc="linear",
                                                                                  blocks=1)), None, {"squeeze-excite"}),
    "grouped_conv": (_grouped_conv, None, {"grouped-conv2d"}),
    "pool": (_conv_two_pools, None, {"pool"}),
    "dense_block": (lambda: import_onnx(cnn_blocks.dense_block(channels=16, growth=8, layers=2, hw=8)), None, set()),
    "convnext": (lambda: import_onnx(cnn_blocks.convnext_block(channels=24, hw=14, depth=1)), OFF_HOST,
                 {"chained-matmul", "depthwise-conv2d"}),
    "attention": (lambda: _decoder_attention(16, 2, 8), {"AttentionProjectionFusionPass": "off"}, {"attention"}),
    "attention_projection": (lambda: _decoder_attention(16, 2, 8), None, {"attention-projection"}),
    "chained_matmul": (lambda: ffn(16, 32, 64, with_ln=False), OFF_HOST, {"chained-matmul"}),
    "multi_matmul": (lambda: swiglu(16, 32, 64), {"ChainedGemmFusionPass": "off"}, {"multi-matmul"}),
    "matmul_norm": (lambda: ffn(16, 32, 64), {"ChainedGemmFusionPass": "off"}, {"matmul+norm"}),
    "reduction": (_softmax, None, {"reduction"}),
    "elementwise": (_elementwise, None, {"elementwise"}),
    "decode": (decode_step, None, {"gemv", "decode-attention"}),
    # grouped-query attention over a symbolic key count (no attention pattern takes it): the flash-decoding
    # kernel; without it, the scores are row dots
    "symbolic_keys": (lambda: gqa_attention(heads=8, kv=2, rows=1, d=16), None, {"flash-decode"}),
    "symbolic_keys_unfused": (lambda: gqa_attention(heads=8, kv=2, rows=1, d=16),
                              {"IncreFlashAttentionFusionPass": "off"}, {"row-dot"}),
    # a whole decode step over a symbolic cache: the QKV projection whose slices go three ways (query, key and
    # value with their rotary embeddings, two of them outputs) is a GEMV with its epilogue after the panels
    "symbolic_decode": (lambda: import_onnx(cache_length_symbolic_step(hidden=32, kv_heads=2, head_dim=8)), None,
                        {"gemv", "flash-decode"}),
}


@functools.lru_cache(maxsize=None)
def _compiled(name):
    make, switches, _ = CASES[name]
    mod = make()
    if any(relax.analysis.tir_vars_in_type(p.ty) for p in mod["main"].params):
        # random inputs need static shapes: the symbolic decode step's numbers are test_onnx_symbolic's
        return compile_ours(mod, switches=switches)
    return assert_same_numbers(mod, switches=switches)      # also: our build agrees with TVM's default


@pytest.mark.parametrize("name", list(CASES))
def test_predicted_rule_is_the_rule_the_schedule_phase_picks(name):
    report = _compiled(name).report
    rows = report.kernels
    assert rows and all("predicted_rule" in k for k in rows), rows
    # a rule that raised on a kernel has a bug (recorded under rule_errors, the next rule took the kernel):
    # the table says what the rules take, not where they crash
    assert not _mispredicted(report)
    assert CASES[name][2] <= {k["rule"] for k in rows}


def _mispredicted(report) -> list:
    """(kernel, kinds, predicted, picked) of every kernel the table gave another rule than the schedule phase.
    Not counted: a kernel on which the predicted rule raised (a rule bug, recorded under rule_errors) or made
    a schedule over on-chip capacity that the recovery moved to the next rule (sizes: the table sees kinds)."""
    errors = report.sections.get("rule_errors", {})
    over = {(r.get("kernel"), r.get("rule")) for r in report.sections.get("ub_overflow_recovered", [])
            if r.get("action") == "next_rule"}
    return [(k["name"], k["kinds"], k["predicted_rule"], k.get("rule")) for k in report.kernels
            if k["predicted_rule"] != k.get("rule")
            and not any(e["rule"] == k["predicted_rule"] for e in errors.get(k["name"], []))
            and (k["name"], k["predicted_rule"]) not in over]


def test_the_cases_cover_every_rule():
    seen = set().union(*({k["rule"] for k in _compiled(name).report.kernels} for name in CASES))
    # (the int8 rules' kernels come from quantized models: tests/schedule/test_matmul_int8.py, test_conv_int8.py;
    # the recurrence rule's from the recurrent converters: tests/test_onnx_recurrent.py; the padded conv's from
    # channel counts no full vector divides, which depend on the host: test_padded_conv.py; the bf16 GEMM's
    # from bf16 builds on hosts with AVX512-BF16: tests/schedule/test_matmul_bf16.py)
    assert {s.name for s in RULE_SPECS} - {"fallback", "matmul_int8", "conv2d_int8", "recurrence",
                                           "conv2d-padded", "matmul_bf16"} <= seen, seen
    assert np.all([k["rule"] != "fallback" for name in CASES for k in _compiled(name).report.kernels])


# ---- kernels with a second output (lower case), made by the grouping with the check off ----------------------
def _concat_into(groups):
    """concat (also an output) -> conv2d (``groups``) + bias + ReLU."""
    def body(bb, x, y, w, b):
        c = bb.emit(op.concat([x, y], axis=1))
        return relax.Tuple([c, bb.emit(op.nn.relu(op.add(op.nn.conv2d(c, w, padding=1, groups=groups), b)))])
    return [(1, 8, 10, 10), (1, 8, 10, 10), (16, 16 // groups, 3, 3), (1, 16, 1, 1)], body


def _pool_then_affine(bb, x, s, b):
    p = bb.emit(op.nn.max_pool2d(x, 3, 1, 1))
    return relax.Tuple([p, bb.emit(op.nn.relu(op.add(op.multiply(p, s), b)))])


def _residual_norm_matmul(bb, x, r, gamma, beta, w):
    a = bb.emit(op.add(x, r))
    return relax.Tuple([a, bb.emit(op.matmul(op.nn.layer_norm(a, gamma, beta, [-1]), w))])


def _relu_concat_pool(bb, x, y):
    a = bb.emit(op.nn.relu(x))
    return relax.Tuple([a, bb.emit(op.nn.max_pool2d(op.concat([a, y], axis=1), 3, 1, 1))])


def _exp_and_sum(bb, x):
    a = bb.emit(op.exp(x))
    return relax.Tuple([a, bb.emit(op.sum(a, axis=[1]))])


def _depthwise_silu_channel_mean(bb, x, w, b):
    y = bb.emit(op.add(op.nn.conv2d(x, w, padding=1, groups=8), b))
    return bb.emit(op.mean(op.multiply(y, op.sigmoid(y)), axis=[1], keepdims=True))


def _built(shapes, body):
    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("shapes, body, kinds", [
    (*_concat_into(1), "lCEE"), (*_concat_into(4), "lQEE"), (*_concat_into(16), "lDEE"),
    ([(1, 8, 10, 10), (1, 8, 1, 1), (1, 8, 1, 1)], _pool_then_affine, "pEEE"),
    ([(16, 64), (16, 64), (64,), (64,), (64, 32)], _residual_norm_matmul, "eRG"),
    ([(1, 8, 10, 10), (1, 8, 10, 10)], _relu_concat_pool, "eLP"),
    ([(64, 64)], _exp_and_sum, "eR"),
    # (no second output) a depthwise conv and a mean over its channels: the row-reduction rule's
    ([(1, 8, 10, 10), (8, 1, 3, 3), (1, 8, 1, 1)], _depthwise_silu_channel_mean, "DEER")])
def test_second_outputs_are_predicted(shapes, body, kinds):
    result = assert_same_numbers(_built(shapes, body), switches={"ScheduleRuleCheck": "off"})
    rows = result.report.kernels
    assert [k["kinds"] for k in rows] == [kinds]
    assert not _mispredicted(result.report), rows


# ---- a reduction beside a product (reading neither's result) --------------------------------------------------
def test_group_shape_marks_a_reduction_beside_the_product():
    # op 0 (concat) feeds a conv (1) and its epilogue (2, 3) and, beside them, a pool (4)
    beside = group_shape("LCEEP", [set(), {0}, {1}, {2}, {0}], outputs={3, 4})
    assert beside.sibling_reduction and predict_rule(beside) is FALLBACK
    after = group_shape("LCEEP", [set(), {0}, {1}, {2}, {3}])
    assert not after.sibling_reduction and predict_rule(after).name == "pool"
    before = group_shape("MECECE", [set(), {0}, {1}, {2}, {3}, {4}])     # a squeeze-excite's mean feeds its FCs
    assert not before.sibling_reduction and predict_rule(before).name == "squeeze-excite"
    # a pool of a kernel input beside the conv (GoogLeNet's pool branch): the pool rule stages it from there
    of_input = group_shape("CEEP", [set(), {0}, {1}, set()], outputs={2, 3})
    assert not of_input.sibling_reduction and predict_rule(of_input).name == "pool"


def _concat_conv_and_pool(channels=(16, 24), hw=17):
    """Inception-v3's grid reduction (Mixed_6a): the block input, a concat, feeds a strided 3x3 conv + bias +
    ReLU and, beside it, a strided 3x3 max-pool; their results are concatenated."""
    def body(bb, a, b, w, bias):
        x = bb.emit(op.concat([a, b], axis=1))
        y = bb.emit(op.nn.relu(op.add(op.nn.conv2d(x, w, strides=2), bias)))
        return bb.emit(op.concat([y, op.nn.max_pool2d(x, 3, 2)], axis=1))
    c = sum(channels)
    return [(1, channels[0], hw, hw), (1, channels[1], hw, hw), (32, c, 3, 3), (1, 32, 1, 1)], body


def test_a_pool_beside_a_conv_is_not_fused_with_it():
    """The pool rule takes a pool of the conv's output; a pool beside the conv fused with it fell to the
    fallback rule (Inception-v3's Mixed_6a at 45 GFLOP/s, a quarter of the model). Each gets its own kernel,
    the concat they share read by both."""
    result = assert_same_numbers(_built(*_concat_conv_and_pool()))
    rows = result.report.kernels
    assert not _mispredicted(result.report), rows
    assert all(k["rule"] != "fallback" for k in rows), rows
    assert {"conv2d", "pool"} <= {k["rule"] for k in rows}, rows



def _depthwise_then_channels_last_norm(channels=32, hw=14):
    """ConvNeXt's block head: a 7x7 depthwise conv + bias, permuted to channels-last, LayerNorm over the
    channels. The norm's rows are pixels, the conv's tiles channel planes: one kernel of both has no tile
    either rule can use (the row rule ran it at 2 GFLOP/s, or over UB onto the fallback)."""
    def body(bb, x, w, b, gamma, beta):
        y = bb.emit(op.add(op.nn.conv2d(x, w, padding=3, groups=channels), b))
        return bb.emit(op.nn.layer_norm(op.permute_dims(y, [0, 2, 3, 1]), gamma, beta, [-1], epsilon=1e-6))
    return [(1, channels, hw, hw), (channels, 1, 7, 7), (1, channels, 1, 1), (channels,), (channels,)], body


@pytest.mark.parametrize("channels, hw", [(32, 14), (40, 56)])
def test_a_depthwise_conv_is_not_fused_with_a_norm_over_its_permuted_channels(channels, hw):
    result = assert_same_numbers(_built(*_depthwise_then_channels_last_norm(channels, hw)))
    rows = result.report.kernels
    assert not _mispredicted(result.report), rows
    assert all(k["rule"] != "fallback" for k in rows), rows
    assert "depthwise-conv2d" in {k["rule"] for k in rows}, rows
