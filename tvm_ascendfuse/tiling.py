"""Tile plans and capacity checks that the grouping pass and the schedule rules share.

The grouping pass decides that a group is legal only if one tile of it fits the NPU's on-chip buffers; the
schedule rule that later tiles the kernel must size that tile from the same numbers, or a group the
grouping accepted would not fit once scheduled. So both import the plans from here: the working set of a
tile (``ub_check``), the cube operands in L0 (``l0_check``), and the row blocks of the kernels that keep
whole rows on chip (``chain_row_block`` for two chained GEMMs, ``attention_row_block`` for attention and its
projections, both through ``row_block_check``).

The working set of a tile is every buffer the tile touches — external inputs, live intermediates, outputs —
each rounded up to the 32 B UB alignment and counted twice when tiles are double-buffered. A streaming group
(elementwise, broadcast, injective, reduction prologue) can shrink its tile to one 32 B block per buffer; a
group that keeps a reduction row resident (the reduction's epilogue reads the row again: normalize, softmax
divide) needs a whole row per buffer. Cube operands must fit L0A/L0B at one fractal.
"""

from __future__ import annotations

from dataclasses import dataclass

from .target import AscendTarget

# Columns of a chained GEMM's intermediate computed per step (the second product's K chunk). 128 rather than
# 64 halves the passes over the accumulator rows (measured faster on the FFN kernels with one thread, the same
# with two).
PANEL_COLS = 128


# Bytes of a cube accumulator element in L0C: float32 whatever the operands' dtype (the NPU's cube
# accumulates fp16/bf16 products in fp32), so a 16-bit kernel's accumulator rows take as much L0C as a
# float32 one's while its UB/L1 rows take half (``dtype_bytes`` below: the bytes of the operands on chip).
ACCUMULATOR_BYTES = 4

# Rows (batch x sequence) of a GEMM up to which it is a GEMV: two FLOPs per weight element read once is
# memory-bound, so the weight is streamed in panels, one panel per task (schedule/gemv.py; rule_specs.py
# routes such kernels there).
GEMV_MAX_ROWS = 4


def row_block(rows: int, cap: int) -> int:
    """Rows per block of a row-blocked kernel: the largest divisor of ``rows`` not above ``cap`` when it is at
    least half of ``cap`` (no tail), else ``cap`` itself (the last block is partial, its rows predicated).
    A prime row count (ViT's 197 tokens) would otherwise get blocks of one row, each streaming the weights."""
    cap = max(1, min(rows, cap))
    d = largest_divisor(rows, cap)
    return d if 2 * d >= cap else cap


def largest_divisor(n: int, cap: int) -> int:
    """The largest divisor of ``n`` not above ``cap`` (1 when ``cap`` < 1)."""
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1


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


# ---- row blocks of the kernels that keep whole rows on chip --------------------------------------------
def accumulator_in_l0c(n2: int, target) -> bool:
    """The second product's accumulator rows live in L0C (the cube accumulates there across the panels)
    when one row fits it; else in UB."""
    return target.align_up(n2 * ACCUMULATOR_BYTES, "l0c") <= target.capacity("local.L0C")


def chain_row_block(n1: int, n2: int, panel: int, n_first: int, rows: int, target, dtype_bytes: int = 4,
                    staged_row: int = 0, norm_after: bool = True) -> CapacityCheck:
    """Rows per block of a chained GEMM (``tile_elems``), or the refusal when one row does not fit.

    UB holds, per row of the block: one panel of the intermediate per first product plus the activated
    panel, and the output row when the accumulator does not fit L0C or when a row norm follows the second
    product (it reads the whole row again; a residual/bias epilogue alone streams the rows out of L0C). All of
    it is produced and consumed on chip, so none is double-buffered. The accumulator rows live in L0C when one
    fits (the cube accumulates there across the panels), which caps the block. With a norm prologue
    (``staged_row``: the first product's input row length) the vector unit normalises one input row at a time
    in UB (the input row streamed from GM, double-buffered, and its normalised row) and stages the block's
    normalised rows in L1, where the cube reads its left operand for every panel: L1 caps the block too. The
    weights stream to the cube through L1/L0A/L0B (``l0_check``)."""
    in_l0c = accumulator_in_l0c(n2, target)
    out_row = norm_after or not in_l0c
    row = [panel] * (n_first + 1) + ([n2] if out_row else [])
    fixed = 0
    if staged_row:
        fixed = (2 if target.double_buffer else 1) * target.align_up(staged_row * dtype_bytes) \
            + target.align_up(staged_row * dtype_bytes)
    what = (f"per row: a {panel}-column panel of the chained GEMM's intermediate ({n1} wide) per product"
            + (f" and its output row ({n2})" if out_row else "")
            + (f"; once: the input row ({staged_row}) being normalised and its normalised row" if staged_row else ""))
    caps = []                                   # (bytes per row of the block, capacity) in L0C / L1
    if in_l0c:
        caps.append((target.align_up(n2 * ACCUMULATOR_BYTES, "l0c"), target.capacity("local.L0C")))
    if staged_row:
        l1_row = target.align_up(staged_row * dtype_bytes, "l1")
        if l1_row > target.capacity("local.L1"):
            return CapacityCheck(False, l1_row, target.capacity("local.L1"), "L1", 0,
                                 f"one normalised input row ({staged_row}) of the chained GEMM")
        caps.append((l1_row, target.capacity("local.L1")))
    return row_block_check(row, dtype_bytes, rows, target, what, resident=True, fixed=fixed, caps=caps)


def chain_rows_per_block(tile_elems: int, rows: int, n2: int, cores: int, target, dtype_bytes: int = 4) -> int:
    """Rows per block the chained-GEMM rule runs on a host of ``cores`` cores: the capacity check's rows
    (``chain_row_block``), at most rows / cores (every core gets a block), at most what L0C holds of the
    accumulator rows when they live there, then ``row_block`` (a divisor of the rows when one is close)."""
    cap = min(tile_elems, max(1, rows // max(1, cores)))
    if accumulator_in_l0c(n2, target):
        cap = min(cap, target.capacity("local.L0C") // target.align_up(n2 * ACCUMULATOR_BYTES, "l0c"))
    return row_block(rows, cap)


def staged_rows_bytes(rows_per_block: int, staged_row: int, target, dtype_bytes: int = 4) -> int:
    """L1 bytes of a norm prologue's normalised rows for one row block."""
    return rows_per_block * target.align_up(staged_row * dtype_bytes, "l1")


# The fused attention + projection walks a head's score rows (``keys`` long) as whole vectors of the host's
# lanes. Key counts no 8-lane vector divides (ViT's 197 = 14x14 patches + the class token, CLIP's 77) left the
# scores, exponentials and probabilities scalar and the kernel slower than the attention and the two
# projections apart: the grouping keeps them apart for such counts.
SCORE_ROW_VECTOR = 8


def score_rows_vectorise(keys: int) -> bool:
    """Whether ``keys``-long score rows are whole ``SCORE_ROW_VECTOR``-lane vectors."""
    return keys % SCORE_ROW_VECTOR == 0


# Its projections walk a block of query rows in register tiles of this many rows; a sequence no such tile
# divides (ViT's 197 query rows, a prime) leaves a short last block whose row checks sit inside every tile's
# reduction loop: the fused kernel then ran slower than the attention and the projections apart.
QUERY_ROW_TILE = 8


def attention_row_block(heads: int, head_dim: int, keys: int, n2: int, rows: int, target, dtype_bytes: int = 4,
                        norm_after: bool = False, query_k: int = 0, query_norm: bool = False) -> CapacityCheck:
    """Query rows per block of the fused attention + projection, or the refusal when one row does not fit.

    Per row of the block, for the head being computed: UB holds its score, exponential and probability rows
    (``keys`` each: the schedule stages all three) and its output row (``head_dim``, the projection's panel),
    plus the projected row when a row norm follows; L1 holds the block's Q and P rows for the cube and, once
    per head, the head's K and V panels (``keys x head_dim`` each, double-buffered so the next head's load
    overlaps); L0C holds the projection's accumulator rows (``n2``) across all heads. With the query projection inside (``query_k``: the input row
    it reads), the block's input rows are staged in L1 for it (normalised first when a row norm precedes it:
    one input row at a time in UB, double-buffered, and its normalised row) and the head's query rows are
    one more ``head_dim`` row in UB."""
    row = [keys, keys, keys, head_dim] + ([head_dim] if query_k else []) + ([n2] if norm_after else [])
    l1_fixed = (2 if target.double_buffer else 1) * 2 * target.align_up(keys * head_dim * dtype_bytes, "l1")
    l1 = target.capacity("local.L1")
    fixed = 0
    if query_norm:
        fixed = (3 if target.double_buffer else 2) * target.align_up(query_k * dtype_bytes)
    what = (f"per query row: one head's scores, exponentials and probabilities ({keys}) and output row ({head_dim})"
            + (f", its query row ({head_dim})" if query_k else "")
            + (f" and the projected row ({n2})" if norm_after else "")
            + f"; in L1 the head's K and V panels ({keys}x{head_dim}) and the block's Q/P rows"
            + (f" and input rows ({query_k})" if query_k else ""))
    if l1_fixed >= l1:
        return CapacityCheck(False, l1_fixed, l1, "L1", 0, f"one head's K and V panels ({keys}x{head_dim})")
    caps = [(target.align_up(n2 * ACCUMULATOR_BYTES, "l0c"), target.capacity("local.L0C")),
            (target.align_up((head_dim + keys + query_k) * dtype_bytes, "l1"), l1 - l1_fixed)]
    return row_block_check(row, dtype_bytes, rows, target, what, resident=True, fixed=fixed, caps=caps)
