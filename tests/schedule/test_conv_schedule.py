"""The conv2d schedule's own choices: register blocks from the host's vector registers, blocks of output rows
from the core count and the target's L1. (Its numbers are checked through the conv and pool rules.)"""

from tvm_ascendfuse.schedule.conv_schedule import _row_blocks, choose_conv_tiles
from tvm_ascendfuse.schedule.hostvec import HostVector
from tvm_ascendfuse.target import get_target


def test_tiles_from_host_registers():
    npu = get_target("ascend910b")
    t = choose_conv_tiles(128, 56, "float32", HostVector(512, 32, 2), npu)
    assert (t.ocb, t.owr) == (32, 8)                       # 2 x 8 = 16 zmm accumulators
    t = choose_conv_tiles(128, 28, "float32", HostVector(512, 32, 2), npu)
    assert (t.ocb, t.owr) == (32, 7)
    # weights re-read per register block: 14 columns per weight vector beat 2 x 7 (7 columns per vector)
    t = choose_conv_tiles(128, 28, "float32", HostVector(512, 32, 2), npu, columns_first=True)
    assert (t.ocb, t.owr) == (16, 14)
    for ow in (56, 7):       # 2 x 8 already has 8 columns; at 7 columns the most accumulators win
        t = choose_conv_tiles(128, ow, "float32", HostVector(512, 32, 2), npu, columns_first=True)
        assert (t.ocb, t.owr) == (32, min(ow, 8))
    t = choose_conv_tiles(64, 28, "float32", HostVector(256, 16, 2), npu)
    assert t.vl == 8 and t.ocr * t.owr <= 8 and 28 % t.owr == 0


def test_row_blocks_are_a_multiple_of_the_cores():
    assert _row_blocks(56, 2) == 4 and _row_blocks(112, 2) == 8 and _row_blocks(8, 2) == 2
    assert _row_blocks(56, 4) == 4 and _row_blocks(48, 3) == 3
    assert _row_blocks(13, 2) is None and _row_blocks(7, 2) is None     # odd or short: padded at the root
    # padded rows sized against a budget: the fewest blocks that fit, else the most
    assert _row_blocks(56, 2, lambda rows: rows * 1000 <= 28_000) == 2
    assert _row_blocks(56, 2, lambda rows: rows * 1000 <= 14_000) == 4
    assert _row_blocks(56, 2, lambda rows: False) == 14


def test_channels_not_a_multiple_of_the_vector_fill_the_register_block():
    """OC a multiple of 8, not of 16 (MobileNet/EfficientNet widths): narrower vectors, as many of them as
    cover the channels of two full vectors, so each broadcast input pixel feeds that many lanes."""
    npu = get_target("ascend910b")
    avx512, avx2 = HostVector(512, 32, 2), HostVector(256, 16, 2)
    for oc, ocb in ((24, 24), (72, 24), (120, 24), (40, 8), (48, 16), (96, 32)):
        t = choose_conv_tiles(oc, 56, "float32", avx512, npu)
        assert (t.ocb, oc % t.ocb, t.ocr * t.owr <= avx512.accumulators) == (ocb, 0, True), oc
    t = choose_conv_tiles(24, 56, "float16", avx512, npu)
    assert (t.vl, t.ocb) == (8, 24)
    t = choose_conv_tiles(12, 28, "float32", avx2, npu)
    assert (t.vl, t.ocb) == (4, 12) and t.ocr * t.owr <= avx2.accumulators
    # a wide kernel keeps its column-first block (the weight stream, not the broadcasts, limits it)
    t = choose_conv_tiles(24, 56, "float32", avx512, npu, columns_first=True)
    assert t.ocb == 8


def test_pointwise_register_block_is_one_vector_by_half_the_accumulators():
    """A 1x1 conv outside the small-plane path: one full vector of output channels x half the accumulator
    count of columns (the largest divisor of OW up to it, when at least half of it; else the whole row when
    it is short enough: no column tail), from the host's registers; narrower vectors (OC a multiple of 8, not 16)
    and hosts of 16 vector registers keep the default block."""
    npu = get_target("ascend910b")
    avx512, avx2 = HostVector(512, 32, 2), HostVector(256, 16, 2)
    for oc, ow, owr in ((96, 112, 8), (144, 56, 8), (16, 112, 8), (64, 28, 7), (32, 60, 6), (48, 5, 5),
                        (256, 13, 13)):
        t = choose_conv_tiles(oc, ow, "float32", avx512, npu, pointwise=True)
        assert (t.vl, t.ocr, t.owr) == (16, 1, owr), (oc, ow)
    # 8 ymm accumulators: one vector x 4 columns would hold four FMAs in flight; the default two vectors
    t = choose_conv_tiles(64, 56, "float32", avx2, npu, pointwise=True)
    assert t == choose_conv_tiles(64, 56, "float32", avx2, npu) and (t.vl, t.ocr, t.owr) == (8, 2, 4)
    for oc in (24, 40, 72):          # 8-lane vectors: the default register block
        assert choose_conv_tiles(oc, 56, "float32", avx512, npu, pointwise=True) == \
            choose_conv_tiles(oc, 56, "float32", avx512, npu)


def test_pointwise_rows_the_half_block_does_not_divide_take_two_vectors():
    """With many input channels (>= 256) and a row half the accumulator count of columns does not divide (14,
    19, 38 wide on AVX-512), the one-vector block would be a narrower divisor (1 x 7 of 14: 7 accumulators)
    or carry a column tail, and misses the 8-column store transpose it is there for: the default two-vector
    block (Xception's 728->728 on 14x14 and 19x19, padded to 736: 2 x 7 and 2 x 8). Fewer input channels,
    or rows the block divides, keep the one-vector block."""
    npu = get_target("ascend910b")
    avx512, avx2 = HostVector(512, 32, 2), HostVector(256, 16, 2)
    for oc, ow, ic, owr in ((736, 14, 728, 7), (64, 28, 256, 7), (736, 19, 728, 8), (736, 38, 256, 8)):
        t = choose_conv_tiles(oc, ow, "float32", avx512, npu, pointwise=True, ic=ic)
        assert (t.vl, t.ocr, t.owr) == (16, 2, owr), (oc, ow)
    for oc, ow, ic, owr in ((128, 150, 128, 6), (64, 28, 64, 7), (736, 56, 728, 8)):
        t = choose_conv_tiles(oc, ow, "float32", avx512, npu, pointwise=True, ic=ic)
        assert (t.vl, t.ocr, t.owr) == (16, 1, owr), (oc, ow)
    # 8 ymm accumulators: 4 columns do not divide 14 either, the default block
    assert choose_conv_tiles(64, 14, "float32", avx2, npu, pointwise=True, ic=512) == \
        choose_conv_tiles(64, 14, "float32", avx2, npu)


def test_pointwise_rows_narrower_than_the_block_take_two_vectors():
    """A pointwise conv whose rows are narrower than half the accumulator count (7x7 planes on AVX-512) would
    leave the one-vector block with 7 of 16 accumulators: it takes the default block, two vectors x the row
    (14 accumulators; measured faster on 192->1152 channels, neutral on 160->960)."""
    npu = get_target("ascend910b")
    avx512 = HostVector(512, 32, 2)
    for oc, ocr in ((1152, 2), (960, 2), (1280, 2), (144, 1)):
        t = choose_conv_tiles(oc, 7, "float32", avx512, npu, pointwise=True)
        assert (t.vl, t.ocr, t.owr) == (16, ocr, 7), oc



def test_rows_the_block_does_not_divide_take_a_block_without_a_column_tail():
    """A column tail predicates every column of the unrolled register block (1.5-2.4x slower on this host):
    widths 13, 17, 27, 35 and 55 (SqueezeNet, Inception) take a block whose columns divide the row, of one or
    two vectors, with at least half the accumulators and at most TAIL_FREE_EXTRA more; a row no such block
    divides (a prime 71) keeps the tail."""
    npu = get_target("ascend910b")
    avx512, avx2 = HostVector(512, 32, 2), HostVector(256, 16, 2)
    for oc, ow, columns_first, block in ((128, 27, True, (2, 9)), (256, 13, True, (1, 13)),
                                         (96, 35, True, (2, 7)), (192, 17, True, (1, 17)),
                                         (64, 55, True, (1, 11)), (256, 13, False, (1, 13))):
        t = choose_conv_tiles(oc, ow, "float32", avx512, npu, columns_first=columns_first)
        assert (t.ocr, t.owr) == block, (oc, ow)
    t = choose_conv_tiles(192, 71, "float32", avx512, npu, columns_first=True)
    assert 71 % t.owr and t.ocr * t.owr <= avx512.accumulators
    t = choose_conv_tiles(64, 35, "float32", avx2, npu)       # 8 ymm accumulators: 2 x 4 would leave a tail
    assert (t.vl, t.ocr, t.owr) == (8, 2, 5)
