"""The one roofline: the grouping pass's kernel cost and the traffic report's modeled time agree."""

import pytest
import tvm
from tvm import relax

from tests.grouping.util import build, legalize
from tvm_ascendfuse.analysis.traffic import count_primfunc, traffic_summary
from tvm_ascendfuse.cost import modeled_time_us
from tvm_ascendfuse.grouping.cost import GroupCost
from tvm_ascendfuse.target import get_target

T = get_target("ascend910b")   # 1600 GB/s, 3 us launch, 48 vector / 24 cube cores


def test_roofline_terms():
    assert modeled_time_us(16e6, 0, 0, T) == pytest.approx(10.0 + 3.0)            # HBM bound
    assert modeled_time_us(16e6, 0, 0, T, launches=2) == pytest.approx(10.0 + 6.0)
    assert modeled_time_us(16e6, 0, 0, T, parallel_efficiency=0.5) == pytest.approx(20.0 + 3.0)
    cube = 2 * 16 * 16 * 16 * 24 * 1.8e9 * 20e-6                                   # 20 us at the cube peak
    assert modeled_time_us(1e3, 0, cube, T) == pytest.approx(23.0)


def test_group_cost_is_the_roofline_with_parallel_efficiency():
    for tiles, eff in ((1000, 1.0), (12, 12 / 48)):
        c = GroupCost(gm_bytes=4.8e6, vector_flops=1e6, cube_flops=0, tiles=tiles, uses_cube=False, launches=1)
        assert c.time_us(T) == modeled_time_us(4.8e6, 1e6, 0, T, 4, 1, parallel_efficiency=eff)


def test_traffic_report_prices_kernels_with_the_same_roofline():
    mod = legalize(build([(32, 64), (64, 48)], lambda bb, a, b: relax.op.matmul(a, b)))
    summary = traffic_summary(mod, T)
    [(name, row)] = summary["kernels"].items()
    k = count_primfunc(mod[name] if isinstance(mod[name], tvm.tirx.PrimFunc) else None, name)
    expected = modeled_time_us(k.gm_bytes, k.vector_flops, k.cube_flops_padded, T, k.dtype_bytes)
    assert row["modeled_time_us"] == round(expected, 3)
    same = GroupCost(k.gm_bytes, k.vector_flops, k.cube_flops_padded, tiles=T.vector_cores, uses_cube=False,
                     dtype_bytes=k.dtype_bytes).time_us(T)
    assert same == pytest.approx(expected)
