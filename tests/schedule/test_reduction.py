"""ReductionRule: row reductions with prologue/epilogue, against the unscheduled kernel."""

import pytest
import tvm
from tvm import tirx
from tvm.relax import op

from tvm_ascendfuse.analysis.ub_usage import kernel_usage
from tvm_ascendfuse.schedule.fast_math import use_fast_math
from tvm_ascendfuse.schedule.hostvec import host_vector
from tvm_ascendfuse.schedule.reduction import ReductionRule
from tvm_ascendfuse.target import get_target

from .kernels import HOST, NATIVE, NPU, check_rule, fused_kernel

# Hosts of both x86 vector widths: kernels are only scheduled for them (this machine may lack their vectors)
AVX2 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"})
AVX512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})


def add_layer_norm(h):
    return ([(6, h), (6, h), (h,), (h,)], lambda x, r, g, b: op.nn.layer_norm(op.add(x, r), g, b, [-1]))


CASES = {
    "add_layer_norm_768": add_layer_norm(768),
    "add_layer_norm_odd": add_layer_norm(33),
    "layer_norm_3d": ([(2, 5, 40), (40,), (40,)], lambda x, g, b: op.nn.layer_norm(x, g, b, [-1])),
    "rms_norm": ([(7, 96), (96,)], lambda x, w: op.nn.rms_norm(x, w, [-1])),
    "softmax_odd": ([(3, 5, 37)], lambda x: op.nn.softmax(x, -1)),
    "softmax_128": ([(2, 4, 128)], lambda x: op.nn.softmax(x, -1)),
    "global_avg_pool": ([(2, 24, 7, 7)], lambda x: op.mean(x, axis=[2, 3], keepdims=True)),
    "sum_rows": ([(5, 1000)], lambda x: op.sum(x, axis=[1])),
    "max_rows": ([(9, 64)], lambda x: op.max(x, axis=[1])),
    "mean_then_scale": ([(4, 48)], lambda x: op.multiply(op.mean(x, axis=[1], keepdims=True), x)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_unscheduled(case):
    shapes, build = CASES[case]
    check_rule(ReductionRule(), fused_kernel(build, shapes))


@pytest.mark.parametrize("case", ["add_layer_norm_768", "softmax_odd"])
def test_avx512_widths(case):
    shapes, build = CASES[case]
    check_rule(ReductionRule(), fused_kernel(build, shapes), host=NATIVE)


def test_float16():
    shapes, build = add_layer_norm(64)
    check_rule(ReductionRule(), fused_kernel(build, shapes, "float16"))
    check_rule(ReductionRule(), fused_kernel(lambda x: op.nn.softmax(x, -1), [(3, 50)], "float16"))


def test_symbolic_batch_and_seq():
    n, s = tirx.Var("n", "int64"), tirx.Var("s", "int64")
    func = fused_kernel(lambda x, g, b: op.nn.layer_norm(x, g, b, [-1]), [(n, s, 64), (64,), (64,)])
    check_rule(ReductionRule(), func, sizes={"n": 2, "s": 3})
    func = fused_kernel(lambda x: op.nn.softmax(x, -1), [(n, s)])        # symbolic row length too
    check_rule(ReductionRule(), func, sizes={"n": 3, "s": 45})


def test_row_is_staged_in_ub_and_partials_are_vectorised():
    shapes, build = add_layer_norm(768)
    mod = check_rule(ReductionRule(), fused_kernel(build, shapes), host=NATIVE)
    text = mod.script()
    assert "_rf" in text and "T.vectorized" in text        # rfactor partials
    usage = kernel_usage("k", mod["main"], NPU)
    assert usage.bytes("local.UB") >= 768 * 4               # the x + r row lives in UB


def test_row_larger_than_ub_streams_and_says_so():
    tiny = get_target("ascend910b", ub_bytes=16 * 1024, ub_reserved_bytes=0, l1_bytes=512 * 1024)
    shapes, build = add_layer_norm(4096)
    rule = ReductionRule()
    mod, note = check_rule(rule, fused_kernel(build, shapes), target=tiny, with_note=True)
    assert note and "row" in note
    assert kernel_usage("k", mod["main"], tiny).bytes("local.UB") < tiny.ub_usable
    assert rule.apply_with_note(fused_kernel(build, shapes), NPU, None).note is None    # the note was the call's


def test_declines_matmul_and_elementwise():
    rule = ReductionRule()
    assert rule.apply(fused_kernel(lambda a, b: op.matmul(a, b), [(8, 16), (16, 4)]), NPU, None) is None
    assert rule.apply(fused_kernel(lambda a: op.exp(a), [(8, 16)]), NPU, None) is None


# ---- LayerNorm over the channels of NCHW (ConvNeXt's downsampling norm): rows reached through transposes ----
def _small_ub(usable: int):
    import dataclasses

    return dataclasses.replace(NPU, ub_reserved_bytes=NPU.ub_bytes - usable)


def ln_over_channels(c, h, w):
    """layer-scale multiply + residual add in NCHW, then NCHW -> NHWC, LayerNorm over C, back to NCHW."""
    def build(x, s, r, g, b):
        t = op.permute_dims(op.add(op.multiply(s, x), r), [0, 2, 3, 1])
        return op.permute_dims(op.nn.layer_norm(t, g, b, [-1], epsilon=1e-6), [0, 3, 1, 2])
    return [(1, c, h, w), (c, 1, 1), (1, c, h, w), (c,), (c,)], build


def gemm_ln_over_channels(c, h, w, k):
    """The same behind the block's last linear layer (NHWC matmul + bias, back to NCHW): matmul+norm."""
    def build(x, wt, bias, s, r, g, b):
        t = op.permute_dims(op.add(op.matmul(x, wt), bias), [0, 3, 1, 2])
        t = op.permute_dims(op.add(op.multiply(s, t), r), [0, 2, 3, 1])
        return op.permute_dims(op.nn.layer_norm(t, g, b, [-1], epsilon=1e-6), [0, 3, 1, 2])
    return [(1, h, w, k), (k, c), (c,), (c, 1, 1), (1, c, h, w), (c,), (c,)], build


def _grouping_verdict(shapes, build, target):
    """The cost-based grouping's capacity check of all the ops as one group (what it decides fusion with)."""
    from tvm import relax

    from tests.grouping.util import build as relax_main, legalize
    from tvm_ascendfuse.grouping import GroupingConfig
    from tvm_ascendfuse.grouping.graph import build_graph
    from tvm_ascendfuse.grouping.model import FusionModel

    mod = legalize(relax_main(shapes, lambda bb, *xs: build(*xs)))
    func = mod["main"]
    [block] = [b for b in func.body.blocks if isinstance(b, relax.DataflowBlock)]
    graph = build_graph(block, func, mod, target, [])
    model = FusionModel(graph, target, GroupingConfig())
    members = [n.idx for n in graph.nodes]
    outs = model.outputs(members, lambda _: None)
    return model.capacity(members, outs, model.inputs(members))


@pytest.mark.parametrize("rule_case", ["reduction", "matmul+norm"])
def test_ln_over_channels_grouping_and_rule_agree_on_ub(rule_case):
    """The grouping accepts the group when one row of each buffer fits UB; the rule that takes the kernel
    then holds blocks of rows (a [C, rows] tile), within UB, though every tensor alone exceeds it: the
    kernel never needs the overflow recovery (split group, fallback rule). Checked against the unscheduled
    kernel."""
    from tvm_ascendfuse.analysis.ub_usage import first_overflow
    from tvm_ascendfuse.schedule.reduction import GemmNormRule

    target = _small_ub(16384)
    c, h, w = 24, 14, 14
    shapes, build = ln_over_channels(c, h, w) if rule_case == "reduction" else gemm_ln_over_channels(c, h, w, 4 * c)
    assert c * h * w * 4 > target.ub_usable            # untiled, one tensor alone overflows
    verdict = _grouping_verdict(shapes, build, target)
    assert verdict.fits, verdict
    rule = ReductionRule() if rule_case == "reduction" else GemmNormRule()
    for host in (HOST, NATIVE):
        mod = check_rule(rule, fused_kernel(build, shapes), host=host, target=target)
        usage = kernel_usage("k", mod["main"], target)
        assert first_overflow(usage, target) is None, usage
        assert 0 < usage.bytes("local.UB") <= target.ub_usable
        # blocks of rows: the staged tile holds more than one row but fewer than all of them
        staged = max(a.nbytes for a in usage.allocations if "transpose" in a.name)
        assert c * 4 < staged < c * h * w * 4, staged


def test_ln_over_channels_odd_shapes_and_real_sizes():
    """Odd channel/plane sizes (blocks of whole plane rows) and ConvNeXt-T's first downsampling norm."""
    for c, h, w in ((5, 3, 6), (20, 5, 5), (96, 56, 56)):
        shapes, build = ln_over_channels(c, h, w)
        mod = check_rule(ReductionRule(), fused_kernel(build, shapes), host=NATIVE)
        assert kernel_usage("k", mod["main"], NPU).bytes("local.UB") <= NPU.ub_usable


def _vector_lanes_by_block(mod):
    """{block name: lanes of the vectorised loops it runs under}."""
    from tvm import s_tir

    found = {}

    def visit(stmt, lanes):
        if isinstance(stmt, tirx.For):
            visit(stmt.body, int(stmt.extent) if stmt.kind == tirx.ForKind.VECTORIZED else lanes)
        elif isinstance(stmt, tirx.SeqStmt):
            for x in stmt.seq:
                visit(x, lanes)
        elif isinstance(stmt, s_tir.SBlockRealize):
            if lanes is not None:
                found.setdefault(stmt.block.name_hint, set()).add(lanes)
            visit(stmt.block.body, lanes)
        elif hasattr(stmt, "body"):
            visit(stmt.body, lanes)
    visit(mod["main"].body, None)
    return found


@pytest.mark.parametrize("keys", [100, 1500])
def test_rows_no_full_vector_divides(keys):
    """Softmax over 100 / 1500 keys (no 16- or 8-lane vector divides them; 4 does): the exponentials and the
    normalised row run as full vectors plus one shorter tail vector, the row maxima and sums as partials of
    20 / 60 lanes on AVX-512, 20 / 20 on AVX2 (a divisor of the row, several full vectors wide), not as 4-lane
    vectors. The numbers are checked on this machine's host, the lanes on both widths."""
    from tvm_ascendfuse.schedule.reduction import partials_width

    assert [partials_width(keys, 16), partials_width(keys, 8)] == {100: [20, 20], 1500: [60, 20]}[keys]
    func = fused_kernel(lambda x: op.nn.softmax(x, -1), [(3, keys)])
    for host in (NATIVE, AVX2, AVX512):
        if host is NATIVE:
            mod = check_rule(ReductionRule(), func, host=NATIVE)
        else:
            mod = ReductionRule().apply_with_note(use_fast_math(func), NPU, host).sch.mod
        vl = host_vector(host).lanes("float32")
        assert keys % vl > 1, "a full vector divides the row: nothing to check"
        lanes = _vector_lanes_by_block(mod)
        exp = set().union(*(v for k, v in lanes.items() if k.startswith("T_softmax_exp")))
        norm = set().union(*(v for k, v in lanes.items() if k.startswith("T_softmax_norm")))
        assert vl in exp and vl in norm and keys % vl in exp, (host, lanes)
        assert lanes.get("T_softmax_maxelem_rf_update") == {partials_width(keys, vl)}, (host, lanes)


def _norm_then_roll(h: int, shift: int):
    """LayerNorm over the channels of NHWC, then a cyclic shift of the rows along H (Swin's roll: a concat of
    two row slices of the normalised tensor)."""
    def build(x, g, b):
        y = op.nn.layer_norm(x, g, b, [-1])
        return op.concat([op.strided_slice(y, [1], [h - shift], [h]), op.strided_slice(y, [1], [0], [h - shift])],
                         axis=1)
    return build


def _loop_work(func) -> int:
    """Iterations of every innermost loop body of a scheduled kernel (what it computes, recomputation included)."""
    total = [0]

    def visit(stmt, outer):
        if isinstance(stmt, tirx.For):
            ext = int(stmt.extent) if isinstance(stmt.extent, tirx.IntImm) else 1
            visit(stmt.body, outer * ext)
        elif isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, outer)
        elif hasattr(stmt, "block"):
            visit(stmt.block.body, outer)
        elif hasattr(stmt, "body") and stmt.body is not None:
            visit(stmt.body, outer)
        else:
            total[0] += outer

    visit(func.body, 1)
    return total[0]


@pytest.mark.parametrize("shape,shift", [((1, 12, 12, 32), 3), ((2, 9, 7, 20), 4)])
def test_norm_read_as_a_window_of_rows_is_not_recomputed_per_row(shape, shift):
    """The rows of the norm are computed once, then the shift reads them: computed per output row instead,
    every row would recompute the whole window of rows the concat's two slices span (Swin-T: 57 rows)."""
    c = shape[-1]
    func = fused_kernel(_norm_then_roll(shape[1], shift), [shape, (c,), (c,)])
    mod = check_rule(ReductionRule(), func, host=NATIVE)
    elems = 1
    for d in shape:
        elems *= d
    # sums, squared sums, the normalised row and the shifted copy: a few passes over the tensor, not H of them
    assert _loop_work(mod["main"]) <= 8 * elems
