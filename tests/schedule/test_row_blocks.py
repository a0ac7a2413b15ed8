"""row_blocks.tiles_are_boxes: which tiles of a producer an epilogue reads as boxes of its own iterations;
runs_each_point_once: whether a placed epilogue runs each of its iterations once."""

from __future__ import annotations

from tvm import s_tir
from tvm.relax import op

from tests.schedule.kernels import fused_kernel
from tvm_ascendfuse.schedule.row_blocks import runs_each_point_once, tiles_are_boxes


def _gemm_and_epilogue(build, shapes):
    """(the GEMM's block, the epilogue's last block with the blocks between inlined, as the rules do)."""
    sch = s_tir.Schedule(fused_kernel(build, shapes))
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    gemm = next(b for b in blocks if b.init is not None)
    for b in blocks[blocks.index(gemm) + 1:-1]:
        sch.compute_inline(sch.get_sblock(b.name_hint))
    return gemm, sch.get(sch.get_sblock(blocks[-1].name_hint))


def test_head_split_boxes_only_tiles_that_divide_or_hold_whole_heads():
    """Columns cut into heads of 80: tiles of 16 or 40 stay inside a head, 160 holds two whole heads; 32 and
    48 cross a head at different points (LeViT's projection under 32-column register blocks)."""
    gemm, epi = _gemm_and_epilogue(lambda x, w: op.reshape(op.matmul(x, w), (1, 6, 8, 80)), [(1, 6, 16), (16, 640)])
    acc = gemm.writes[0].source
    for cols, box in [(16, True), (40, True), (80, True), (160, True), (32, False), (48, False), (640, True)]:
        assert tiles_are_boxes(epi, acc, [1, 2, cols]) is box, cols
    assert tiles_are_boxes(epi, acc, [1, None, 32]) is False
    assert tiles_are_boxes(epi, acc, [1, 4, None]) is True


def test_rows_one_to_one_with_an_iterator_are_always_boxes():
    gemm, epi = _gemm_and_epilogue(lambda x, w, b: op.nn.relu(op.add(op.matmul(x, w), b)), [(7, 16), (16, 40), (40,)])
    acc = gemm.writes[0].source
    assert tiles_are_boxes(epi, acc, [3, 32])
    assert tiles_are_boxes(epi, acc, [None, 7])


def test_two_reads_in_different_tiles_are_not_one_box():
    """``y[:, j] * y[:, j + 32]`` (a gate read from the other half): each iteration reads two tiles of 32. TVM
    gives the block one read window of 33 columns; a window is not analysed, so no tile is taken as a box."""
    def build(x, w):
        y = op.matmul(x, w)
        return op.multiply(op.strided_slice(y, [1], [0], [32]), op.strided_slice(y, [1], [32], [64]))

    gemm, epi = _gemm_and_epilogue(build, [(4, 16), (16, 64)])
    acc = gemm.writes[0].source
    assert tiles_are_boxes(epi, acc, [4, 32]) is False
    assert tiles_are_boxes(epi, acc, [4, 64]) is False


def test_a_block_that_does_not_read_the_buffer_is_not_placed():
    gemm, epi = _gemm_and_epilogue(lambda x, w: op.nn.relu(op.matmul(x, w)), [(4, 16), (16, 64)])
    assert tiles_are_boxes(gemm, epi.writes[0].source, [4, 32]) is False


def _plane_gemm_placed(cols_per_tile):
    """A GEMM over a 14 x 14 plane whose columns are split in tiles of ``cols_per_tile`` (a 16-column padded
    tile's 8-column register blocks where 8 does not divide 14), the flattening epilogue placed per tile."""
    f = fused_kernel(lambda x, w: op.reshape(op.matmul(x, w), (196, 24)), [(14, 14, 16), (16, 24)])
    sch = s_tir.Schedule(f)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    gemm, epi = blocks[0], blocks[-1]
    assert runs_each_point_once(sch, epi) is True               # at the root: once each
    _, j, _, _ = sch.get_loops(gemm)
    jo, _ = sch.split(j, [None, cols_per_tile])
    sch.reverse_compute_at(epi, jo)
    return sch, epi


def test_a_tile_bound_reaching_into_the_next_plane_row_runs_points_twice():
    """Columns 8..13 of a row are a box of 6 flat pixels, but TVM bounds the epilogue under that tile by 8
    pixels from 14 * y + 8: the first two pixels of the next row run in this tile too (gcvit's QKV projection:
    another task's accumulator rows, a race)."""
    sch, epi = _plane_gemm_placed(8)
    assert runs_each_point_once(sch, epi) is False
    sch, epi = _plane_gemm_placed(7)                            # 7 divides 14: each pixel in one tile
    assert runs_each_point_once(sch, epi) is True
