"""SqueezeExciteRule: spatial mean -> FC -> act -> FC -> gate in one kernel computes what the unscheduled kernel
computes (odd channel counts, batch 2, symbolic batch, large planes, fp32/fp16, conv and linear FCs); other
kernels are declined."""

from __future__ import annotations

import pytest
from tvm import relax, tirx
from tvm.relax import op

from tests.schedule.kernels import HOST, NATIVE, check_rule, fused_kernel
from tvm_ascendfuse.schedule.squeeze_excite import SqueezeExciteRule


def hardsigmoid(y, dtype):
    return op.clip(op.add(op.multiply(y, relax.const(1 / 6, dtype)), relax.const(0.5, dtype)), 0, 1)


def se_conv(act="relu", gate="sigmoid", dtype="float32"):
    def build(x, w1, b1, w2, b2):
        s = op.mean(x, axis=[2, 3], keepdims=True)
        h = op.add(op.nn.conv2d(s, w1), b1)
        h = op.nn.relu(h) if act == "relu" else op.nn.silu(h)
        g = op.add(op.nn.conv2d(h, w2), b2)
        return op.sigmoid(g) if gate == "sigmoid" else hardsigmoid(g, dtype)
    return build


def se_linear(dtype="float32"):
    def build(x, w1, b1, w2, b2):
        bb = relax.BlockBuilder.current()
        s = bb.normalize(op.mean(x, axis=[2, 3], keepdims=True))
        n, c = s.ty.shape[0], s.ty.shape[1]
        s = op.reshape(s, (n, c))
        h = op.nn.relu(op.add(op.matmul(s, w1), b1))
        g = op.sigmoid(op.add(op.matmul(h, w2), b2))
        return op.reshape(g, (n, c, 1, 1))
    return build


def conv_shapes(n, c, cs, h, w):
    return [(n, c, h, w), (cs, c, 1, 1), (1, cs, 1, 1), (c, cs, 1, 1), (1, c, 1, 1)]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n,c,cs,h,w,act,gate", [
    (1, 16, 4, 7, 7, "relu", "sigmoid"),
    (2, 13, 3, 5, 9, "silu", "sigmoid"),            # odd channels, not a multiple of the vector width
    (1, 24, 8, 14, 14, "relu", "hardsigmoid"),      # MobileNetV3
    (1, 32, 8, 56, 56, "silu", "sigmoid"),          # a plane large enough for the parallel squeeze
], ids=["small", "odd_batch2", "hardsigmoid", "large_plane"])
def test_se_conv_form(n, c, cs, h, w, act, gate, dtype):
    func = fused_kernel(se_conv(act, gate, dtype), conv_shapes(n, c, cs, h, w), dtype)
    mod = check_rule(SqueezeExciteRule(), func, host=NATIVE)
    assert "local.UB" in mod.script()


def test_se_linear_form():
    func = fused_kernel(se_linear(), [(2, 12, 6, 6), (12, 3), (3,), (3, 12), (12,)])
    check_rule(SqueezeExciteRule(), func, host=HOST)


def test_se_symbolic_batch():
    n = tirx.Var("n", "int64")
    func = fused_kernel(se_conv(), conv_shapes(n, 10, 4, 6, 6))
    check_rule(SqueezeExciteRule(), func, host=HOST, sizes={"n": 3})


@pytest.mark.parametrize("build,shapes", [
    (lambda x, w: op.nn.relu(op.nn.conv2d(x, w)), [(1, 8, 6, 6), (4, 8, 1, 1)]),                 # a conv
    (lambda x: op.mean(x, axis=[2, 3], keepdims=True), [(1, 8, 6, 6)]),                          # a pool alone
    (lambda x, w1, w2: op.sigmoid(op.nn.conv2d(op.nn.relu(op.nn.conv2d(                         # no squeeze
        x, w1)), w2)), [(1, 8, 1, 1), (4, 8, 1, 1), (8, 4, 1, 1)]),
], ids=["conv", "mean", "no_squeeze"])
def test_other_kernels_declined(build, shapes):
    check_rule(SqueezeExciteRule(), fused_kernel(build, shapes), expect=False)


@pytest.mark.parametrize("h,w,width", [(7, 7, 7), (14, 14, 14), (10, 10, 10), (56, 56, 16), (3, 3, 1)])
def test_squeeze_partial_sums_are_as_wide_as_a_divisor_allows(h, w, width):
    """The plane sum's partial sums take the widest divisor of the plane up to a vector (AVX-512: 16), so a
    7x7 plane sums 7 chains of 7 (not one scalar chain of 49) and a 14x14 plane 14 of 14 (not 4 of 49);
    exact on batch 2 with odd channels."""
    import tvm

    from tests.schedule.kernels import NPU

    func = fused_kernel(se_conv("silu"), conv_shapes(2, 21, 5, h, w))
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    assert f"partial sums {width}\"" in SqueezeExciteRule().apply(func, NPU, avx512).mod.script()
    check_rule(SqueezeExciteRule(), func, host=NATIVE)


def test_partial_sum_width():
    from tvm_ascendfuse.schedule.partial_sums import partial_sum_width

    assert [partial_sum_width(n, 16) for n in (49, 196, 3136, 100, 9, 8, 12544)] == [7, 14, 16, 10, 1, 4, 16]
    assert [partial_sum_width(n, 8) for n in (49, 196, 64)] == [7, 7, 8]
    assert partial_sum_width(None, 16) == 16
    assert [partial_sum_width(n, 4) for n in (49, 196, 10)] == [7, 7, 5]     # SSE: two registers, not scalar


def _fc_vector_widths(mod) -> list[int]:
    """Lanes of the vectorised loop right around each FC update block (0: the block is not in one)."""
    from tvm import s_tir

    widths = []

    def visit(stmt, vec):
        if isinstance(stmt, tirx.For):
            kind = vec if not isinstance(stmt.body, s_tir.SBlockRealize) else (
                int(stmt.extent) if stmt.kind == tirx.ForKind.VECTORIZED else 0)
            visit(stmt.body, kind)
        elif isinstance(stmt, s_tir.SBlockRealize):
            blk = stmt.block
            if blk.name_hint.startswith("conv2d_nchw") and "init" not in blk.name_hint and any(
                    iv.iter_type != tirx.IterVar.DataPar for iv in blk.iter_vars):
                widths.append(vec)
            visit(blk.body, 0)
            if blk.init is not None:
                visit(blk.init, 0)
        elif isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, vec)
        elif hasattr(stmt, "body"):
            visit(stmt.body, vec)

    visit(mod["main"].body, 0)
    return widths


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n,c,cs", [(2, 40, 19), (1, 196, 52), (1, 24, 8)], ids=["odd_hidden", "wide", "even"])
def test_fc_channels_stay_vectors(n, c, cs, dtype):
    """Each FC runs on vectors of output channels: one the full vector divides in full vectors, another as
    full vectors plus one shorter vector for the remainder (19 hidden channels: 16 + 3, 40 gate channels
    on AVX-512: 32 + 8), never scalar; exact on batch 2 with odd channels."""
    import tvm

    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    func = fused_kernel(se_conv("relu", "sigmoid", dtype), conv_shapes(n, c, cs, 5, 5), dtype)
    from tests.schedule.kernels import NPU
    widths = _fc_vector_widths(SqueezeExciteRule().apply(func, NPU, avx512).mod)
    lanes = 16 if dtype == "float32" else 32
    expect = []
    for ch in (cs, c):
        full = ch if ch <= lanes else lanes
        expect += [full] + ([ch % lanes] if ch > lanes and ch % lanes else [])
    assert widths == expect
    check_rule(SqueezeExciteRule(), func, host=NATIVE)


def _fc_in_parallel(mod) -> list[bool]:
    """Per FC update block: is it inside a parallel loop?"""
    from tvm import s_tir

    found = []

    def visit(stmt, par):
        if isinstance(stmt, tirx.For):
            visit(stmt.body, par or stmt.kind == tirx.ForKind.PARALLEL)
        elif isinstance(stmt, s_tir.SBlockRealize):
            blk = stmt.block
            if blk.name_hint.startswith("conv2d_nchw") and "init" not in blk.name_hint and any(
                    iv.iter_type != tirx.IterVar.DataPar for iv in blk.iter_vars):
                found.append(par)
            visit(blk.body, par)
        elif isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, par)
        elif hasattr(stmt, "body"):
            visit(stmt.body, par)

    visit(mod["main"].body, False)
    return found


@pytest.mark.parametrize("n,c,cs,parallel", [
    (1, 960, 240, [True, True]),             # MobileNetV3-Large's last SE: 0.9 MB per FC weight
    (2, 400, 100, [True, False, True]),      # 96 + 4 hidden channels: the full vectors on every core
    (1, 72, 24, [False] * 4),                # a few KiB: one core (16 + 8 and 64 + 8 channels)
], ids=["large", "odd_hidden_batch2", "small"])
def test_large_fcs_run_on_every_core(n, c, cs, parallel):
    """An FC whose weight has at least FC_PARALLEL_MIN_BYTES runs its blocks of output channels in parallel
    (measured on a 2-core Zen 5: MobileNetV3-Large's SE kernels 0.66x the time on one core), a small one on
    one core (a fork/join costs more than it saves); numbers exact."""
    import tvm

    from tests.schedule.kernels import NPU
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    func = fused_kernel(se_conv("relu", "hardsigmoid"), conv_shapes(n, c, cs, 7, 7))
    assert _fc_in_parallel(SqueezeExciteRule().apply(func, NPU, avx512).mod) == parallel
    check_rule(SqueezeExciteRule(), func, host=NATIVE)
