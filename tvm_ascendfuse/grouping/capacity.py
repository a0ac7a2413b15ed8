"""Does one tile of a fused group fit the NPU's on-chip buffers?

The working set of a tile is every buffer the tile touches — external inputs, live intermediates, outputs —
each rounded up to the 32 B UB alignment and counted twice when tiles are double-buffered. A streaming group
(elementwise, broadcast, injective, reduction prologue) can shrink its tile to one 32 B block per buffer; a
group that keeps a reduction row resident (the reduction's epilogue reads the row again: normalize, softmax
divide) needs a whole row per buffer. Cube operands must fit L0A/L0B at one fractal.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..target import AscendTarget


@dataclass(frozen=True)
class TileBuffer:
    elems: int          # elements of the whole tensor
    dtype_bytes: int


@dataclass(frozen=True)
class CapacityCheck:
    fits: bool
    needed_bytes: int
    available_bytes: int
    scope: str = "UB"
    tile_elems: int = 0          # largest tile (elements per buffer) that fits; 0 when nothing fits
    what: str = ""               # what had to fit, when it is not simply "one tile"


def tile_bytes(buffers: list[TileBuffer], tile_elems: int, target: AscendTarget) -> int:
    mult = 2 if target.double_buffer else 1
    return sum(mult * target.align_up(min(b.elems, tile_elems) * b.dtype_bytes) for b in buffers)


def ub_check(buffers: list[TileBuffer], min_tile_elems: int, target: AscendTarget) -> CapacityCheck:
    """Minimal tile must fit; also returns the largest power-of-two tile that fits (for tile counting)."""
    avail = target.ub_usable
    need = tile_bytes(buffers, min_tile_elems, target)
    if need > avail:
        return CapacityCheck(False, need, avail, "UB", 0)
    t = max(1, min_tile_elems)
    biggest = max((b.elems for b in buffers), default=t)
    while t * 2 <= biggest and tile_bytes(buffers, t * 2, target) <= avail:
        t *= 2
    if t < biggest and tile_bytes(buffers, biggest, target) <= avail:
        t = biggest
    return CapacityCheck(True, need, avail, "UB", t)


def l0_check(dtype_bytes: int, target: AscendTarget) -> CapacityCheck:
    """One fractal of each cube operand (double-buffered) in L0A / L0B."""
    mult = 2 if target.double_buffer else 1
    a = mult * target.align_up(target.cube_m * target.cube_k * dtype_bytes, "l0a")
    b = mult * target.align_up(target.cube_k * target.cube_n * dtype_bytes, "l0b")
    if a > target.l0a_bytes:
        return CapacityCheck(False, a, target.l0a_bytes, "L0A")
    if b > target.l0b_bytes:
        return CapacityCheck(False, b, target.l0b_bytes, "L0B")
    return CapacityCheck(True, max(a, b), min(target.l0a_bytes, target.l0b_bytes), "L0")


def row_block_check(row_elems: list[int], dtype_bytes: int, rows: int, target: AscendTarget,
                    what: str = "one row of each row-block buffer", resident: bool = False, fixed: int = 0,
                    caps=()) -> CapacityCheck:
    """A kernel that keeps whole rows in UB (a chained GEMM's panel rows): one row of every buffer must fit;
    ``tile_elems`` is then the number of rows per block (largest power of two that fits, at most ``rows``).
    ``resident``: the buffers are produced and consumed on chip (no DMA to overlap), so not double-buffered.
    ``fixed``: UB bytes a block holds whatever its row count; ``caps``: (bytes per row, capacity) of other
    on-chip buffers the block's rows fill (accumulator rows in L0C, rows staged in L1), each capping it."""
    mult = 2 if target.double_buffer and not resident else 1
    per_row = mult * sum(target.align_up(n * dtype_bytes) for n in row_elems)
    avail = target.ub_usable
    if per_row + fixed > avail:
        return CapacityCheck(False, per_row + fixed, avail, "UB", 0, what)

    def fits(m):
        return m * per_row + fixed <= avail and all(m * b <= c for b, c in caps)

    m = 1
    while m * 2 <= max(1, rows) and fits(m * 2):
        m *= 2
    return CapacityCheck(True, m * per_row + fixed, avail, "UB", m, what)
