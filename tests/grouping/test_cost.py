"""The grouping pass's cost model on hand-computed cases."""

import pytest

from tvm_ascendfuse.grouping.cost import GroupCost, GroupingConfig, accept, pad_ratio, padded_bytes
from tvm_ascendfuse.target import get_target

T = get_target("ascend910b")   # 1600 GB/s, 3 us launch, 48 vector / 24 cube cores


def test_memory_bound_kernel_time():
    # 16 MB over 1.6 TB/s = 10 us, plus a 3 us launch; plenty of tiles so no parallelism loss
    c = GroupCost(gm_bytes=16e6, vector_flops=1e6, cube_flops=0, tiles=1000, uses_cube=False)
    assert c.time_us(T) == pytest.approx(13.0)


def test_compute_bound_cube_kernel_time():
    peak = 2 * 16 * 16 * 16 * 24 * 1.8e9     # 353.9 TFLOP/s
    c = GroupCost(gm_bytes=1e3, vector_flops=0, cube_flops=peak * 20e-6, tiles=24, uses_cube=True)
    assert c.time_us(T) == pytest.approx(23.0)


def test_parallelism_loss_when_fewer_tiles_than_cores():
    full = GroupCost(4.8e6, 0, 0, tiles=48, uses_cube=False).time_us(T)        # 3 us + 3 us
    quarter = GroupCost(4.8e6, 0, 0, tiles=12, uses_cube=False).time_us(T)     # 12 us + 3 us
    assert full == pytest.approx(6.0)
    assert quarter == pytest.approx(15.0)


def test_fusion_gain_drops_intermediate_and_launch():
    # y = relu(x + b), x 4 MiB: unfused add reads 4 MiB + writes 4 MiB, relu reads + writes 4 MiB
    mib = 4 * 2**20
    add = GroupCost(2 * mib, 2**20, 0, 1000, False)
    relu = GroupCost(2 * mib, 2**20, 0, 1000, False)
    fused = GroupCost(2 * mib, 2**21, 0, 1000, False)
    before = add.time_us(T) + relu.time_us(T)
    gain = before - fused.time_us(T)
    assert gain == pytest.approx(2 * mib / 1600e9 * 1e6 + 3.0)
    assert accept(gain, before, GroupingConfig())
    assert not accept(gain, before, GroupingConfig(min_gain_ratio=0.6))   # CANN-style 60 % threshold


def test_block_padding():
    assert padded_bytes([10, 3], 4, T) == 10 * 32          # 12 B rows occupy one 32 B block
    assert padded_bytes([10, 8], 4, T) == 320
    assert pad_ratio([7, 5], 2, T) == pytest.approx(32 / 10)
