"""The grouping pass's prices: a kernel's modeled cost (``GroupCost``), block padding, and the knobs.

A group's time is the one roofline (``tvm_ascendfuse/cost.py``, modeled, never measured). Tiling losses are
charged explicitly:
* GM transfers move whole 32 B blocks: every tensor's innermost dimension is padded to ``ub_align``;
* cube work is padded to the fractal (M, N, K rounded up to ``cube_m/n/k``, counted on the TIR);
* a duplicated producer is recomputed in every group that holds a copy (its FLOPs and input reads count
  once per copy);
* parallelism: a group with fewer tiles than cores keeps only ``tiles / cores`` of the peak and of the
  bandwidth (one core cannot saturate HBM on its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from ..cost import modeled_time_us
from ..target import AscendTarget


@dataclass(frozen=True)
class GroupingConfig:
    """Knobs of the grouping pass. Every default is a modelling choice, not a hardware fact."""

    min_gain_us: float = 0.01        # XLA-style epsilon: a merge must save more than this (modeled us)
    min_gain_ratio: float = 0.0      # CANN-style relative threshold on the unfused time (0.3 = 30 %)
    max_ops: int = 32                # cap: call_tirs in one group
    max_depth: int = 16              # cap: longest producer->consumer chain inside a group
    # cap: external inputs of a group (growth of the kernel signature). 32, not 24: a DenseNet-121 dense
    # layer late in its third block reads the concat of 21-24 earlier outputs plus the BN's scale and shift
    # and the conv's weight and bias; with 24 those layers lost their conv prologue (a concat kernel and a
    # BN + ReLU kernel of their own in front of the conv): 0.91x the model's time with 32 (2-core Zen 5, one
    # process, the two builds interleaved); the kernels of SqueezeNet, GoogLeNet, Inception-v3,
    # ShuffleNetV2, EfficientNet-B0 and GPT-2 came out the same
    max_params: int = 32
    max_reductions: int = 2          # reductions (row-resident) in one group
    allow_duplication: bool = True   # duplicate cheap single-op producers into all their consumers
    allow_siblings: bool = True      # merge two consumers of one tensor
    allow_multi_output: bool = True  # a group may also write a value it consumes inside
    allow_chained_gemm: bool = True  # a GEMM feeding a second GEMM's row operand, per row block (FFN up->down)
    allow_attention_projection: bool = True  # attention + its output projection, per block of query rows
    chain_min_saving_vs_weights: float = 0.1  # chained GEMM: intermediate round-trip bytes / weight bytes
    chain_host_cores: int = 0        # > 0: the build runs on a CPU host of that many cores; a chained GEMM must
                                     # also win there (chain.Chain.host_cost). 0: the NPU model alone
    max_sibling_fanout: int = 8      # sibling candidates looked at per shared tensor
    cube_tile_elems: int = 128 * 128  # output elements of one cube tile (fits L0C with fp32 accumulation)
    # refuse a merge whose kernel no schedule rule would take as well as its parts (rule_specs.py)
    schedulable_only: bool = True
    # groups whose scheduled kernel exceeded on-chip capacity in an earlier run on the same module:
    # ((block key, member node indices, needed bytes, available bytes), ...); no group may again hold all
    # members of one (pipeline.py)
    forbidden: tuple = ()


@dataclass(frozen=True)
class GroupCost:
    """What one kernel (fused or not) costs in the model."""

    gm_bytes: float
    vector_flops: float
    cube_flops: float      # already padded to the cube fractal
    tiles: int
    uses_cube: bool
    dtype_bytes: int = 4
    launches: int = 1
    dense_bytes: float = 0.0   # GM bytes without block padding (what the TIR count measures)

    def time_us(self, target: AscendTarget) -> float:
        cores = target.cube_cores if self.uses_cube else target.vector_cores
        eff = min(1.0, max(1, self.tiles) / cores)
        return modeled_time_us(self.gm_bytes, self.vector_flops, self.cube_flops, target, self.dtype_bytes,
                               self.launches, parallel_efficiency=eff)


def padded_bytes(shape: list[int], dtype_bytes: int, target: AscendTarget) -> int:
    """Bytes a tensor occupies in 32 B blocks: innermost dimension rounded up to the UB alignment."""
    if not shape:
        return target.align_up(dtype_bytes)
    inner = target.align_up(shape[-1] * dtype_bytes)
    outer = 1
    for d in shape[:-1]:
        outer *= d
    return outer * inner


def pad_ratio(shape: list[int], dtype_bytes: int, target: AscendTarget) -> float:
    """Padded / dense size (>= 1) of a tensor."""
    dense = dtype_bytes
    for d in shape:
        dense *= d
    return padded_bytes(shape, dtype_bytes, target) / dense if dense else 1.0


def tiles_for(out_elems: int, tile_elems: int) -> int:
    return max(1, ceil(out_elems / max(1, tile_elems)))


def accept(gain: float, before: float, cfg: GroupingConfig) -> bool:
    return gain > cfg.min_gain_us and gain > cfg.min_gain_ratio * before
