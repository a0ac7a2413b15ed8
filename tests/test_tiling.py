"""The tile plans and capacity checks grouping and schedules share, on hand-computed cases."""

import dataclasses

from tvm_ascendfuse.target import get_target, make_target
from tvm_ascendfuse.tiling import (TileBuffer, attention_row_block, chain_row_block, l0_check, staged_rows_bytes,
                                   tile_bytes, ub_check)

T = get_target("ascend910b")


def test_ub_check_bytes():
    # three fp32 buffers, minimal tile 8 elements: 3 * 2 (double buffer) * 32 B
    bufs = [TileBuffer(1 << 20, 4)] * 3
    chk = ub_check(bufs, 8, T)
    assert chk.fits and chk.needed_bytes == 192 and chk.available_bytes == 184 * 1024
    assert tile_bytes(bufs, chk.tile_elems, T) <= T.ub_usable < tile_bytes(bufs, 2 * chk.tile_elems, T)
    row = ub_check([TileBuffer(65536 * 2, 4)] * 2, 65536, T)   # two 256 KiB rows
    assert not row.fits and row.needed_bytes == 2 * 2 * 65536 * 4
    single = ub_check([TileBuffer(65536 * 2, 4)] * 2, 65536, make_target("ascend910b", double_buffer=False,
                                                                          ub_bytes=520 * 1024, l1_bytes=1 << 20))
    assert single.fits


def test_l0_check():
    assert l0_check(2, T).fits
    tiny = make_target("ascend910b", l0a_bytes=512)
    chk = l0_check(4, tiny)
    assert not chk.fits and chk.scope == "L0A" and chk.needed_bytes == 2 * 16 * 16 * 4


def test_chain_row_block_budget():
    """W7's FFN (2816 wide, 1024 in and out, SwiGLU pair): 32 rows per block, capped by L0C (32 accumulator
    rows of 4 KiB); UB holds three 64-column panels per row plus the row being normalised; the 32 normalised
    rows (128 KiB) sit in L1. W3's FFN (post-LN: its output row stays in UB for the norm) keeps its budget."""
    npu = get_target("ascend910b")
    w7 = chain_row_block(2816, 1024, 64, 2, 256, npu, staged_row=1024, norm_after=False)
    assert w7.fits and w7.tile_elems == 32 and w7.needed_bytes == 32 * 3 * 256 + 3 * 4096
    assert staged_rows_bytes(w7.tile_elems, 1024, npu) == 128 * 1024 <= npu.capacity("local.L1")
    w3 = chain_row_block(3072, 768, 64, 1, 128, npu)
    assert w3.fits and w3.tile_elems == 32 and w3.needed_bytes == 32 * (768 + 2 * 64) * 4
    tight = dataclasses.replace(npu, l1_bytes=256 * 1024)
    assert chain_row_block(2816, 1024, 64, 2, 256, tight, staged_row=4096, norm_after=False).tile_elems == 16


def test_attention_row_block_budget():
    """W7's attention (16 heads of 64, 256 keys) with its query (after an RMSNorm over 1024) and output
    projections: per query row UB holds the three key-long rows the schedule stages (scores, exponentials,
    probabilities) and two head rows (query, output); once, the input row being normalised (double-buffered)
    and its normalised row. 32 rows per block, capped by L0C (32 accumulator rows of 4 KiB)."""
    npu = get_target("ascend910b")
    check = attention_row_block(16, 64, 256, 1024, 256, npu, query_k=1024, query_norm=True)
    assert check.fits and check.tile_elems == 32
    assert check.needed_bytes == 32 * (3 * 256 + 2 * 64) * 4 + 3 * 1024 * 4
    small_l0c = dataclasses.replace(npu, l0c_bytes=64 * 1024)
    assert attention_row_block(16, 64, 256, 1024, 256, small_l0c).tile_elems == 16
