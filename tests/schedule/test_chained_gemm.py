"""ChainedGemmRule: FFN up-projection (+ activation / SwiGLU pair) -> down-projection (+ residual, norm) in one
kernel, per row block; against the unscheduled kernel, and through the whole pipeline with constant weights."""

import dataclasses
import math

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax import op

from tests.helpers import assert_same_numbers, assert_scheduled_within_capacity, kernel_count
from tvm_ascendfuse.analysis.ub_usage import kernel_usage
from tvm_ascendfuse.schedule.chained_gemm import ChainedGemmRule
from tvm_ascendfuse.target import get_target

from .kernels import HOST, NATIVE, NPU, check_rule, fused_kernel

ON = {"ChainedGemmFusionPass": "on", "ChainedGemmHostCost": "off"}  # the rule, whatever the host costs


def ffn_ln(m, k, f):
    return ([(m, k), (k, f), (f,), (f, k), (k,), (k,), (k,)],
            lambda x, w1, b1, w2, b2, g, be: op.nn.layer_norm(
                op.add(op.add(op.matmul(op.nn.gelu(op.add(op.matmul(x, w1), b1)), w2), b2), x), g, be, [-1]))


def ffn_relu(m, k, f, n):
    return ([(m, k), (k, f), (f, n)], lambda x, w1, w2: op.matmul(op.nn.relu(op.matmul(x, w1)), w2))


def swiglu(m, k, f):
    return ([(1, m, k), (k, f), (k, f), (f, k)],
            lambda x, wg, wu, wd: op.add(op.matmul(op.multiply(op.nn.silu(op.matmul(x, wg)), op.matmul(x, wu)), wd), x))


@pytest.mark.parametrize("shapes_build", [ffn_ln(16, 32, 64), ffn_ln(13, 20, 36), ffn_relu(7, 12, 100, 24),
                                          swiglu(12, 16, 40), swiglu(9, 24, 56)])
def test_matches_unscheduled(shapes_build):
    shapes, build = shapes_build
    _, note = check_rule(ChainedGemmRule(), fused_kernel(build, shapes), with_note=True)
    assert note and "row block" in note


def _scopes(sch):
    return {str(b.scope()) for b in sch.mod["main"].body.block.alloc_buffers}


@pytest.mark.parametrize("shapes_build", [ffn_ln(16, 32, 64), swiglu(6, 8, 24)])
def test_accumulator_rows_in_l0c_no_partial_product_buffer(shapes_build):
    """The second product accumulates in place into its rows (in L0C: a scope apart from the UB panel,
    which keeps its register tile in registers on the host), zeroed once: no per-panel partial product."""
    shapes, build = shapes_build
    sch = ChainedGemmRule().apply(fused_kernel(build, shapes), NPU, HOST)
    assert "local.L0C" in _scopes(sch)
    names = [b.name for b in sch.mod["main"].body.block.alloc_buffers]
    assert not any(n.endswith("_rf") for n in names), names
    check_rule(ChainedGemmRule(), fused_kernel(build, shapes))


@pytest.mark.parametrize("l0c,scope,rows", [(2 * 32 * 4, "local.L0C", 2), (64, "local.UB", 8)])
def test_row_block_capped_by_l0c_or_accumulator_in_ub(l0c, scope, rows):
    """A small L0C caps the row block (its accumulator rows must fit); when not even one row fits, the
    accumulator stays in UB — same numbers either way."""
    shapes, build = ffn_ln(16, 32, 64)
    npu = dataclasses.replace(NPU, l0c_bytes=l0c)
    rule = ChainedGemmRule()
    _, note = check_rule(rule, fused_kernel(build, shapes), target=npu, with_note=True)
    assert f"row block {rows} rows" in note, note
    assert scope in _scopes(rule.apply(fused_kernel(build, shapes), npu, HOST))


def test_avx512_widths():
    shapes, build = ffn_ln(16, 64, 128)
    check_rule(ChainedGemmRule(), fused_kernel(build, shapes), host=NATIVE)


def test_declines_a_single_gemm_and_independent_gemms():
    check_rule(ChainedGemmRule(), fused_kernel(lambda x, w: op.nn.relu(op.matmul(x, w)), [(8, 16), (16, 32)]),
               expect=False)
    check_rule(ChainedGemmRule(), fused_kernel(lambda x, a, b: op.multiply(op.matmul(x, a), op.matmul(x, b)),
                                               [(8, 16), (16, 32), (16, 32)]), expect=False)


def _ffn_module(rows, k, f, seed=0):
    """x -> LayerNorm(x + (GELU(x W1 + b1)) W2 + b2), weights as constants (pre-packed by the pipeline)."""
    rng = np.random.default_rng(seed)
    c = lambda *s: relax.const((rng.standard_normal(s) * 0.2).astype("float32"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, rows, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.gelu(op.add(op.matmul(x, c(k, f)), c(f))))
            y = bb.emit(op.add(op.add(op.matmul(h, c(f, k)), c(k)), x))
            out = bb.emit_output(op.nn.layer_norm(y, c(k), c(k), [-1]))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("target", ["ascend910b", "ascend310p"])
@pytest.mark.parametrize("rows,k,f", [(16, 32, 128), (13, 24, 72)])
def test_pipeline_one_kernel_within_ub(target, rows, k, f):
    result = assert_same_numbers(_ffn_module(rows, k, f), target=target, switches=ON)
    assert kernel_count(result) == 1
    assert list(result.report.sections["schedules"].values()) == ["chained-matmul"]
    npu = get_target(target)
    for gv, func in result.scheduled_module.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and func.attrs and "tirx.is_scheduled" in func.attrs:
            usage = kernel_usage(gv.name_hint, func, npu)
            ub = sum(a.aligned or 0 for a in usage.allocations if a.scope == "local.UB")
            assert 0 < ub <= npu.ub_usable, (gv.name_hint, ub)
            l0c = sum(a.aligned or 0 for a in usage.allocations if a.scope == "local.L0C")
            assert 0 < l0c <= npu.capacity("local.L0C"), (gv.name_hint, l0c)


def test_switch_is_on_by_default_and_off_is_reported():
    assert kernel_count(assert_same_numbers(_ffn_module(16, 32, 128))) == 1
    result = assert_same_numbers(_ffn_module(16, 32, 128), switches={"ChainedGemmFusionPass": "off"})
    assert kernel_count(result) == 2
    refused = result.report.get("CostBasedFusionPass").not_effective
    assert any("chained GEMMs switched off" in r.get("why", "") for r in refused)


# ---- norm prologue: the row norm in front of the first product(s) computed per row block ---------------------

def rms_swiglu(m, k, f):
    """Pre-norm SwiGLU FFN, W7's FFN kernel: down(silu(rms(h) Wg) * (rms(h) Wu)) + h, the norm computed once."""
    def build(h, g, wg, wu, wd):
        n = op.nn.rms_norm(h, g)
        return op.add(op.matmul(op.multiply(op.nn.silu(op.matmul(n, wg)), op.matmul(n, wu)), wd), h)
    return [(1, m, k), (k,), (k, f), (k, f), (f, k)], build


def ln_relu(m, k, f, n):
    return ([(m, k), (k,), (k,), (k, f), (f, n)],
            lambda x, g, b, w1, w2: op.matmul(op.nn.relu(op.matmul(op.nn.layer_norm(x, g, b, [-1]), w1)), w2))


def _alloc(sch):
    return {b.name: str(b.scope()) for b in sch.mod["main"].body.block.alloc_buffers}


@pytest.mark.parametrize("shapes_build", [rms_swiglu(12, 32, 40), rms_swiglu(7, 24, 56), rms_swiglu(13, 64, 128),
                                          ln_relu(9, 32, 100, 24)])
def test_norm_prologue_matches_unscheduled(shapes_build):
    """Odd row counts (one-row and three-row blocks) included; the normalised rows are one on-chip buffer of
    the row block in L1 (the cube's operand), every other intermediate on chip too."""
    shapes, build = shapes_build
    _, note = check_rule(ChainedGemmRule(), fused_kernel(build, shapes), with_note=True)
    assert "norm prologue" in note, note
    scopes = _alloc(ChainedGemmRule().apply(fused_kernel(build, shapes), NPU, HOST))
    assert list(scopes.values()).count("local.L1") == 1, scopes
    assert all(s.startswith("local.") for s in scopes.values()), scopes


def test_norm_prologue_avx512_widths():
    shapes, build = rms_swiglu(16, 48, 64)
    check_rule(ChainedGemmRule(), fused_kernel(build, shapes), host=NATIVE)


def test_declines_a_norm_also_read_after_the_second_product():
    """Post-norm (the normalised rows are also the residual): not a prologue this rule schedules."""
    def build(x, g, b, w1, w2):
        n = op.nn.layer_norm(x, g, b, [-1])
        return op.add(op.matmul(op.nn.relu(op.matmul(n, w1)), w2), n)
    check_rule(ChainedGemmRule(), fused_kernel(build, [(9, 32), (32,), (32,), (32, 40), (40, 32)]), expect=False)


def _prenorm_module(rows, k, f, seed=0):
    """h = x Wo + x, then h + SwiGLU(rms_norm(h)): an o-projection and the FFN of a pre-norm decoder block."""
    rng = np.random.default_rng(seed)
    c = lambda *s: relax.const((rng.standard_normal(s) * 0.2).astype("float32"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, rows, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.add(op.matmul(x, c(k, k)), x))
            n = bb.emit(op.nn.rms_norm(h, relax.const((1 + rng.random(k) * 0.1).astype("float32"))))
            a = bb.emit(op.multiply(op.nn.silu(op.matmul(n, c(k, f))), op.matmul(n, c(k, f))))
            out = bb.emit_output(op.add(op.matmul(a, c(f, k)), h))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("rows,k,f", [(16, 32, 128), (13, 64, 176)])
def test_pipeline_norm_prologue_within_capacity(rows, k, f):
    """Through the pipeline (constant weights pre-packed): two kernels, the norm inside the chained FFN, the
    normalised rows within L1 and everything else within UB / L0C."""
    result = assert_same_numbers(_prenorm_module(rows, k, f), switches=ON)
    assert kernel_count(result) == 2
    notes = [n for ns in result.report.sections["schedule_notes"].values() for n in ns]
    assert any("norm prologue" in n for n in notes), notes
    assert_scheduled_within_capacity(result, "ascend910b")


@pytest.mark.parametrize("shapes_build", [ffn_ln(197, 16, 32), rms_swiglu(37, 16, 24), ffn_relu(53, 8, 16, 8)])
def test_prime_row_count_gets_whole_row_blocks_with_a_partial_tail(shapes_build):
    """A prime row count (ViT's 197 tokens) has no divisor near the row-block size: blocks of the size the
    capacity allows with a predicated last block, not one-row blocks that re-stream the weights per row."""
    shapes, build = shapes_build
    _, note = check_rule(ChainedGemmRule(), fused_kernel(build, shapes), with_note=True)
    rows = math.prod(shapes[0][:-1])
    m = int(note.split("row block ")[1].split(" ")[0])
    assert m > 1 and rows % m != 0, note


def test_row_block_prefers_a_divisor_without_a_tail():
    from tvm_ascendfuse.schedule.common import row_block

    assert row_block(128, 60) == 32          # 32 >= 60 / 2: no tail
    assert row_block(197, 98) == 98          # prime: a partial last block instead of 1-row blocks
    assert row_block(12, 100) == 12
    assert row_block(5, 0) == 1


def convnext_ffn(n, h, w, c, f, norm_after=False):
    """A ConvNeXt block's point-wise part: channels-last rows (N, H, W, C) -> LayerNorm over C -> linear ->
    GELU -> linear -> permute back to NCHW -> layer scale (C, 1, 1) -> + residual (NCHW); ``norm_after``:
    then a LayerNorm over the channels of the NCHW result (LayerNorm2d, a stage's downsample) in NCHW."""
    shapes = [(n, h, w, c), (c,), (c,), (c, f), (f,), (f, c), (c,), (c, 1, 1), (n, c, h, w)]
    if norm_after:
        shapes += [(c,), (c,)]

    def build(x, g, b, w1, b1, w2, b2, scale, res, *g2):
        y = op.add(op.matmul(op.nn.gelu(op.add(op.matmul(op.nn.layer_norm(x, g, b, [-1]), w1), b1)), w2), b2)
        out = op.add(op.multiply(scale, op.permute_dims(y, [0, 3, 1, 2])), res)
        if g2:
            out = op.permute_dims(op.nn.layer_norm(op.permute_dims(out, [0, 2, 3, 1]), g2[0], g2[1], [-1]),
                                  [0, 3, 1, 2])
        return out
    return shapes, build


@pytest.mark.parametrize("shapes_build", [convnext_ffn(1, 8, 8, 32, 128), convnext_ffn(2, 5, 7, 24, 96),
                                          convnext_ffn(1, 7, 7, 20, 80), convnext_ffn(2, 4, 6, 16, 64, True)])
def test_channels_first_output_matches_unscheduled(shapes_build):
    """ConvNeXt's point-wise part ends in NCHW: the rows are N x H x W, each channel's rows stored as one run."""
    shapes, build = shapes_build
    _, note = check_rule(ChainedGemmRule(), fused_kernel(build, shapes), with_note=True)
    assert note and "row block" in note and "norm prologue" in note


def ffn_ln_nhwc(n, h, w, c, f):
    """ffn_ln on channels-last rows (N, H, W, C): the rows span three loops."""
    shapes = [(n, h, w, c), (c, f), (f,), (f, c), (c,), (c,), (c,)]
    return shapes, ffn_ln(1, 1, 1)[1]


@pytest.mark.parametrize("shapes_build", [ffn_ln_nhwc(1, 7, 7, 16, 32), ffn_ln_nhwc(1, 5, 7, 8, 24),
                                          convnext_ffn(1, 5, 7, 12, 24), convnext_ffn(2, 3, 9, 8, 16)])
def test_rows_over_several_loops_get_whole_inner_rows(shapes_build):
    """Rows over (N, H, W) loops: a row block of whole W rows (or a divisor of W), so row blocks do not overlap
    (else the row-block loop could not run in parallel) and no block has a partial tail."""
    shapes, build = shapes_build
    _, note = check_rule(ChainedGemmRule(), fused_kernel(build, shapes), with_note=True)
    m = int(note.split("row block ")[1].split(" rows")[0])
    w = shapes[0][2]
    assert m % w == 0 or w % m == 0, note
