"""AttentionRule: softmax(Q·Kᵀ·scale + mask)·V in one kernel, row-blocked, against the unscheduled kernel."""

import numpy as np
import pytest
from tvm import tirx
from tvm.relax import op

from tvm_ascendfuse.analysis.ub_usage import kernel_usage
from tvm_ascendfuse.schedule.attention import AttentionRule
from tvm_ascendfuse.target import get_target

from .kernels import NATIVE, NPU, attention_kernel, causal_mask, check_rule, fused_kernel


@pytest.mark.parametrize("kw", [
    dict(h=2, s=32, d=16, mask="full"),
    dict(h=3, s=37, d=24, mask=None),          # odd sizes, no mask
    dict(b=2, h=1, s=20, d=12, mask="full", sq=9),   # fewer query rows than keys
])
def test_matches_unscheduled(kw):
    check_rule(AttentionRule(), attention_kernel(**kw))


def test_causal_mask():
    """LLaMA-style mask: the most negative float above the diagonal must give exact zeros' worth."""
    check_rule(AttentionRule(), attention_kernel(h=2, s=24, d=8, mask="causal"), fixed={3: causal_mask(24, 24)})


def test_avx512_widths():
    check_rule(AttentionRule(), attention_kernel(h=2, s=64, d=32, mask="causal"), host=NATIVE,
               fixed={3: causal_mask(64, 64)})


def test_float16():
    check_rule(AttentionRule(), attention_kernel(h=2, s=16, d=8, mask="full", dtype="float16"))


def test_symbolic_batch():
    n = tirx.Var("n", "int64")
    func = fused_kernel(lambda q, k, v: op.matmul(op.nn.softmax(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])), -1), v),
                        [(n, 2, 16, 8), (n, 2, 16, 8), (n, 2, 16, 8)])
    check_rule(AttentionRule(), func, sizes={"n": 3})


@pytest.mark.parametrize("name", ["ascend910b", "ascend310p"])
def test_score_block_fits_ub(name):
    t = get_target(name)
    mod = check_rule(AttentionRule(), attention_kernel(h=2, s=256, d=64, mask="causal"), target=t, host=NATIVE,
                     fixed={3: causal_mask(256, 256)})
    used = kernel_usage("attn", mod["main"], t).bytes("local.UB")
    assert 256 * 4 <= used <= t.ub_usable          # at least one score row, never more than UB


def test_declines_single_matmul_and_softmax():
    rule = AttentionRule()
    assert rule.apply(fused_kernel(lambda a, b: op.matmul(a, b), [(8, 16), (16, 4)]), NPU, None) is None
    assert rule.apply(fused_kernel(lambda a: op.nn.softmax(a), [(8, 16)]), NPU, None) is None


def merged_head_split_kernel(h=4, s=32, d=16):
    """Attention whose Q, K, V are slices of one merged projection (1, s, 3·h·d), cut into heads."""
    hid = h * d

    def build(qkv):
        def part(i, perm):
            y = op.strided_slice(qkv, axes=[2], begin=[i * hid], end=[(i + 1) * hid])
            return op.permute_dims(op.reshape(y, (1, s, h, d)), perm)
        scores = op.multiply(op.matmul(part(0, [0, 2, 1, 3]), part(1, [0, 2, 3, 1])), relax_const(d ** -0.5))
        return op.matmul(op.nn.softmax(scores, -1), part(2, [0, 2, 1, 3]))
    return fused_kernel(build, [(1, s, 3 * hid)])


def relax_const(v):
    from tvm import relax
    return relax.const(v, "float32")


def test_merged_head_split_panels_per_head():
    """Heads cut out of a merged projection: V is read in place by P·V (no per-block copy), Kᵀ is staged
    once per head (outside the query-block loop), and the numbers match the unscheduled kernel."""
    mod = check_rule(AttentionRule(), merged_head_split_kernel())
    lines = mod["main"].script().splitlines()
    row_loop = next(i for i, line in enumerate(lines) if line.strip().startswith("for ax1_0 in"))
    kt = next(i for i, line in enumerate(lines) if 'sblock("T_transpose1")' in line)
    assert kt < row_loop                                   # Kᵀ gathered before the query-block loop
    pv = next(i for i, line in enumerate(lines) if 'sblock("matmul1_update")' in line)
    reads = next(line for line in lines[pv:] if "T.reads(" in line)
    assert "p0[" in reads                                  # P·V reads V in the merged projection
    staged = [line for line in lines if "sblock_alloc_buffer" in line and "transpose" in line]
    assert len(staged) == 2, staged                        # Q rows and Kᵀ; no V copy


def window_attention_kernel(windows=4, h=3, rows=49, keys=64, d=16, side=7):
    """Swin-style window attention: each window's ``rows`` = side x side query rows against ``keys`` keys,
    the output written back as image rows (``reshape`` + ``permute``: the window reverse, an epilogue that
    does not inline into the P·V block and follows each block of rows instead)."""
    grid = int(windows ** 0.5)

    def build(q, k, v):
        o = op.matmul(op.nn.softmax(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])), -1), v)
        o = op.reshape(o, (1, grid, grid, h, side, side, d))
        return op.permute_dims(o, [0, 1, 4, 2, 5, 3, 6])

    return fused_kernel(build, [(windows, h, rows, d), (windows, h, keys, d), (windows, h, keys, d)])


def test_window_reverse_epilogue_gets_whole_image_rows_per_block():
    """64 keys leave room for 32 of the 49 query rows per block; 32 rows are four image rows and four pixels of
    the fifth, which the window-reverse epilogue cannot follow exactly (it wrote the rest of that image row
    from rows the block did not compute). Only row counts the epilogue reads as boxes are used: 7 here."""
    check_rule(AttentionRule(), window_attention_kernel(), host=NATIVE)


def test_exact_row_blocks_of_a_window_reverse():
    """Blocks of rows of a 7x7 window read by a window reverse: whole image rows (7, 14 with a short last
    block, 49), pixels within one image row (1), never 2 or 4 (they split image rows at different points) nor
    32."""
    from tvm import s_tir

    from tvm_ascendfuse.schedule.row_blocks import exact_row_blocks

    sch = s_tir.Schedule(window_attention_kernel(windows=1, h=1))
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    pv = [b for b in blocks if b.init is not None][-1]            # the last product: P·V
    for b in blocks[blocks.index(pv) + 1:-1]:                      # the epilogue's reshape, as the rule does
        sch.compute_inline(sch.get_sblock(b.name_hint))
    tail = sch.get(sch.get_sblock(blocks[-1].name_hint))
    buf = pv.writes[0].source
    assert exact_row_blocks(tail, buf, 2, 49, [49, 32, 14, 7, 4, 2, 1]) == [49, 14, 7, 1]
    assert exact_row_blocks(pv, tail.writes[0].source, 2, 49, [7]) is None     # does not read it


def padded_key_attention_kernel(h=3, s=37, d=16, keys_to=48):
    """Attention as the graph pass leaves a key count no vector width divides (DeiT's 197 tokens): Kᵀ and V
    zero-padded to ``keys_to`` keys, an additive mask row (4th parameter, ``key_pad_mask``) hiding them."""
    def build(q, k, v, mask):
        kt = op.nn.pad(op.permute_dims(k, [0, 1, 3, 2]), [0, 0, 0, 0, 0, 0, 0, keys_to - s])
        vp = op.nn.pad(v, [0, 0, 0, 0, 0, keys_to - s, 0, 0])
        sc = op.add(op.multiply(op.matmul(q, kt), relax_const(d ** -0.5)), mask)
        return op.matmul(op.nn.softmax(sc, -1), vp)
    return fused_kernel(build, [(1, h, s, d)] * 3 + [(keys_to,)])


def key_pad_mask(s=37, keys_to=48):
    return np.where(np.arange(keys_to) < s, 0.0, np.finfo("float32").min).astype("float32")


def test_few_heads_query_groups_stage_panels_once_per_group():
    """DeiT-Tiny's attention (three heads of 64, 197 tokens padded to 208 keys) on two cores: each head's
    query blocks are cut into two parallel groups (six equal shares), and the padded Kᵀ and V panels are staged
    once per (head, group), before the query-block loop, not once per query block; the numbers match the
    unscheduled kernel."""
    mod = check_rule(AttentionRule(), padded_key_attention_kernel(s=197, d=64, keys_to=208), host=NATIVE,
                     fixed={3: key_pad_mask(197, 208)})
    lines = mod["main"].script().splitlines()
    par = next(line for line in lines if "T.parallel(" in line)
    assert "T.parallel(T.int64(6))" in par, par
    row_loop = next(i for i, line in enumerate(lines) if line.strip().startswith("for ") and " in range(" in line)
    assert "range(T.int64(1))" not in lines[row_loop]       # several query blocks per group
    pads = [i for i, line in enumerate(lines) if 'sblock("PadInput' in line]
    assert len(pads) == 2 and all(i < row_loop for i in pads), (pads, row_loop)


def test_query_groups():
    from tvm_ascendfuse.schedule.attention import query_groups

    assert query_groups(3, 25, 2) == 2          # 6 shares on 2 cores
    assert query_groups(12, 25, 2) == 1         # heads alone fill the cores
    assert query_groups(1, 25, 2) == 4
    assert query_groups(5, 25, 4) == 4          # 20 shares: a multiple of the 4 cores
    assert query_groups(1, 1, 2) == 1           # one query block: nothing to cut
