"""The one roofline of the cost model: the modeled NPU time of a kernel (modeled, never measured).

    time = max(GM bytes / HBM bandwidth, vector FLOPs / vector peak, cube FLOPs / cube peak) / parallel eff.
           + launches x launch overhead

Every figure comes from ``AscendTarget``. The grouping pass prices candidate groups with it
(``grouping/cost.GroupCost``, which also charges block padding, cube fractal padding and too few tiles to
fill the cores), and the traffic report prices the kernels of a compiled module (``analysis/traffic``).
"""

from __future__ import annotations


def modeled_time_us(gm_bytes: float, vector_flops: float, cube_flops: float, target, dtype_bytes: int = 4,
                    launches: int = 1, parallel_efficiency: float = 1.0) -> float:
    """Microseconds the roofline gives: the slowest of HBM traffic, vector and cube work at their peaks
    (scaled down by ``parallel_efficiency`` when a kernel cannot occupy every core), plus launch overhead."""
    roof = max(gm_bytes / target.hbm_bytes_per_s, vector_flops / target.vector_flops(dtype_bytes),
               cube_flops / target.cube_flops())
    return roof / parallel_efficiency * 1e6 + launches * target.launch_overhead_us
