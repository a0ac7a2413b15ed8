"""Register transpose of a conv accumulator tile for its NCHW store.

The conv's register block keeps output channels on the vector lanes (NCHW[vl]c accumulator), the output is
NCHW (columns contiguous). Read with the columns on the lanes, every vector is ``rows`` lane-strided loads
(LLVM: one scalar load and insert per lane). This tensor intrinsic instead loads the ``rows`` accumulator
vectors once and transposes them with two-source shuffles (unpack ps, unpack pd, then two output rows per
full-width shuffle, stored whole): 3 shuffle stages instead of one load+insert per element.

The input side (``transpose_load``) is the mirror image: a pointwise conv stages its NCHW input NCHW[16]c,
which read lane by lane is one scalar load and insert per element; 16 channel rows of 8 columns are instead
loaded as 8-lane vectors, paired into 16-lane vectors and transposed by 3 shuffle stages into 8 whole rows.
"""

from __future__ import annotations

import re

import tvm
from tvm.s_tir import ScheduleError
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script.builder import ir as T

from .common import predicated, register_intrin_once, substitute_vars

ROWS, LANES = 8, 16        # columns x channels of the tile: AVX-512 fp32 with 8 output columns


def _name(dtype: str, rows: int, lanes: int) -> str:
    return f"ascendfuse_transpose_{rows}x{lanes}_{dtype}"


def _build(dtype: str, rows: int, lanes: int, impl: bool):
    """The intrinsic's description (``impl`` False: a plain transpose block) or implementation (the shuffle
    network), built with TVMScript's IR builder: parsing the same function as text took ~0.2 s a process."""
    i64 = T.int64
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("f")
            a, b = T.arg("a", T.handle()), T.arg("b", T.handle())
            A = T.match_buffer(a, (i64(rows), i64(lanes)), dtype, strides=[T.int64(), i64(1)], offset_factor=1,
                               scope="local.UB")
            B = T.match_buffer(b, (i64(lanes), i64(rows)), dtype, strides=[i64(rows), i64(1)], offset_factor=1,
                               scope="local.UB")
            with T.sblock("root"):
                T.reads(A[i64(0):i64(rows), i64(0):i64(lanes)])
                T.writes(B[i64(0):i64(lanes), i64(0):i64(rows)])
                if impl:
                    _shuffle_network(A, B, dtype, rows, lanes)
                else:
                    with T.grid(i64(rows), i64(lanes)) as (i, j):
                        with T.sblock("transpose"):
                            vi, vj = T.axis.remap("SS", [i, j])
                            T.buffer_store(B, A[vi, vj], [vj, vi])
    return ib.get()


def _unpack_ps(lanes: int, half: int) -> list[int]:
    """Two-source shuffle like unpacklo/hi_ps per 128-bit quad: lane quad q takes elements 4q+{0,1} (half 0)
    or 4q+{2,3} (half 1) of both sources, interleaved."""
    return [k + 2 * half for q in range(lanes // 4) for k in (4 * q, lanes + 4 * q, 4 * q + 1, lanes + 4 * q + 1)]


def _unpack_pd(lanes: int, j: int) -> list[int]:
    """Two-source shuffle like unpacklo/hi_pd per quad: pair 0 (j even) or pair 1 (j odd) of each source."""
    off = 2 * (j % 2)
    return [k for q in range(lanes // 4) for k in (4 * q + off, 4 * q + off + 1, lanes + 4 * q + off,
                                                   lanes + 4 * q + off + 1)]


def _register_once(name: str, build) -> str:
    """Register intrinsic ``name`` from ``build(impl: bool)`` unless this process already has it."""
    return register_intrin_once(name, lambda: (build(False), build(True)))


def _apply_on_copy_first(sch, apply) -> bool:
    """``apply(sch)`` if it succeeds on a copy of ``sch``; False (``sch`` untouched) when a primitive refuses."""
    try:
        apply(sch.copy())
    except ScheduleError:   # a tile the intrinsic does not match: the caller keeps its loops
        return False
    apply(sch)
    return True


def _shuffle_network(A, B, dtype: str, rows: int, lanes: int) -> None:
    """Stores of the transposed tile. Expressions, not bindings: a bound vector becomes a local buffer,
    allocated per parallel task."""
    i64 = T.int64
    row = [A.vload([i64(i), i64(0)], f"{dtype}x{lanes}") for i in range(rows)]

    def shuffle(x, y, idx):
        return T.Shuffle([x, y], list(idx))

    # stage 1 (unpacklo/hi_ps of row pairs): lane quad q holds rows 2p, 2p+1 of channels 4q+{0,1} / 4q+{2,3}
    st1 = {(half, p): shuffle(row[2 * p], row[2 * p + 1], _unpack_ps(lanes, half)) for half in (0, 1)
           for p in range(rows // 2)}
    # stage 2 (unpacklo/hi_pd): c[g, j] lane quad q = rows 4g..4g+3 of channel 4q+j
    st2 = {(g, j): shuffle(st1[j // 2, 2 * g], st1[j // 2, 2 * g + 1], _unpack_pd(lanes, j))
           for g in range(rows // 4) for j in range(4)}

    # stage 3: output row 4q+j = quad q of c[0, j] (rows 0-3) then of c[1, j] (rows 4-7). Output rows are
    # contiguous (stride = rows), so rows 2m, 2m+1 are one full-width store through a flat view of B
    # (8-lane stores were split by LLVM into 128-bit pieces the epilogue's loads could not forward from).
    def out_row(r):        # the row twice over: the final shuffle takes the low half of each
        q, j = divmod(r, 4)
        idx = [4 * q + k for k in range(4)] + [lanes + 4 * q + k for k in range(4)]
        return shuffle(st2[0, j], st2[1, j], idx * (lanes // 8))

    flat = T.decl_buffer((i64(lanes * rows),), dtype, data=B.data, elem_offset=B.elem_offset, scope="local.UB")
    for m in range(lanes // 2):
        pair = shuffle(out_row(2 * m), out_row(2 * m + 1), list(range(8)) + list(range(lanes, lanes + 8)))
        T.buffer_store(flat, pair, [T.Ramp(i64(2 * m * rows), i64(1), 2 * rows)])


def transpose_intrin(dtype: str, rows: int, lanes: int) -> str | None:
    """Name of the registered (rows x lanes) -> (lanes x rows) transpose intrinsic, None when this tile
    shape has no shuffle network here (only 8 rows of 16 lanes: AVX-512 fp32 with 8 output columns)."""
    if (rows, lanes) != (ROWS, LANES):
        return None
    return _register_once(_name(dtype, rows, lanes), lambda impl: _build(dtype, rows, lanes, impl))


def transpose_store(sch, epilogue, acc_buf, rows: int, lanes: int) -> bool:
    """Stage the NCHW[lanes]c accumulator tile that ``epilogue`` reads (``rows`` columns at its loop) into
    an NCHW tile through the shuffle intrinsic, so the epilogue reads columns contiguously. Tried on a copy
    of the schedule first: False (schedule untouched) when the intrinsic or a primitive does not apply."""
    dtype = str(acc_buf.ty.dtype)
    name = transpose_intrin(dtype, rows, lanes)
    if name is None or len(acc_buf.ty.shape) != 5:
        return False
    reads = [r.source for r in sch.get(epilogue).reads]
    idx = next((i for i, r in enumerate(reads) if r.same_as(acc_buf)), None)
    if idx is None:
        return False

    def apply(s):
        tile = s.cache_read(epilogue, idx, "local.UB")
        s.transform_layout(tile, ("write", 0),
                           lambda n, fo, y, x, fi: (n, y, x // rows, fo * lanes + fi, x % rows))
        s.tensorize(s.get_loops(tile)[-2], name)

    return _apply_on_copy_first(sch, apply)       # else the epilogue keeps its strided reads


# ---- input side: NCHW input -> NCHW[lanes]c staging of a pointwise conv ----------------------------------

IN_LANES, IN_COLS = 16, 8   # channels x columns of the tile: 16 rows of one 8-lane load -> 8 rows of 16 lanes
STAGE_LANES = (8, 16)       # channels a staging/store transpose takes: AVX-512 fp32, and AVX2 or 8 | channels


def _in_name(dtype: str, lanes: int, cols: int) -> str:
    return f"ascendfuse_transpose_in_{lanes}x{cols}_{dtype}"


def _build_in(dtype: str, lanes: int, cols: int, impl: bool):
    """(lanes channels x cols columns of the NCHW input, rows a channel plane apart) -> (cols x lanes) of the
    NCHW[lanes]c staging buffer: description (a plain transpose block) or shuffle-network implementation."""
    i64 = T.int64
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("f")
            a, b = T.arg("a", T.handle()), T.arg("b", T.handle())
            # (channel, row, column): tensorize matches the trailing dims of the input's 4-d region
            A = T.match_buffer(a, (i64(lanes), i64(1), i64(cols)), dtype, strides=[T.int64(), T.int64(), i64(1)],
                               offset_factor=1)
            B = T.match_buffer(b, (i64(cols), i64(lanes)), dtype, strides=[i64(lanes), i64(1)], offset_factor=1)
            with T.sblock("root"):
                T.reads(A[i64(0):i64(lanes), i64(0):i64(1), i64(0):i64(cols)])
                T.writes(B[i64(0):i64(cols), i64(0):i64(lanes)])
                if impl:
                    _in_shuffle_network(A, B, dtype, lanes, cols)
                else:
                    with T.grid(i64(lanes), i64(cols)) as (i, j):
                        with T.sblock("transpose"):
                            vi, vj = T.axis.remap("SS", [i, j])
                            T.buffer_store(B, A[vi, i64(0), vj], [vj, vi])
    return ib.get()


def in_transpose_lanes(lanes: int, cols: int):
    """Lane sources of the 16x8 input network, as (stage list, outputs), for the exactness test and the
    builder alike: each stage entry is (operand a, operand b, shuffle indices) over earlier values; values
    0..lanes-1 are the loaded rows (channels, ``cols`` lanes each)."""
    half = cols                                # a loaded row fills half an output vector
    vals: list = []                            # (a, b, idx)
    nrow = lanes

    def add(a, b, idx):
        vals.append((a, b, list(idx)))
        return nrow + len(vals) - 1

    if lanes == cols:
        # 8 lanes (AVX2, or a channel count 16 does not divide): a loaded row is a whole vector, one 8x8
        # transpose by the same quad-wise unpack stages
        st1 = {(h, p): add(2 * p, 2 * p + 1, _unpack_ps(lanes, h)) for h in (0, 1) for p in range(lanes // 2)}
        st2 = {(g, j): add(st1[j // 2, 2 * g], st1[j // 2, 2 * g + 1], _unpack_pd(lanes, j))
               for g in range(lanes // 4) for j in range(4)}
        outs = [add(st2[0, c % 4], st2[1, c % 4], [4 * (c // 4) + k for k in range(4)]
                    + [lanes + 4 * (c // 4) + k for k in range(4)]) for c in range(cols)]
        return vals, outs
    # stage 0 (insert 256-bit half): z[k] = rows k and k + 8 side by side (channel k on half 0, k+8 on half 1)
    z = [add(k, k + half, range(2 * half)) for k in range(half)]
    # stage 1 (unpacklo/hi_ps of z pairs) and stage 2 (unpacklo/hi_pd): an 8x8 transpose in each 256-bit half
    st1 = {(h, p): add(z[2 * p], z[2 * p + 1], _unpack_ps(lanes, h)) for h in (0, 1) for p in range(half // 2)}
    st2 = {(g, j): add(st1[j // 2, 2 * g], st1[j // 2, 2 * g + 1], _unpack_pd(lanes, j))
           for g in range(half // 4) for j in range(4)}
    # stage 3: quad q = 2h + l of st2[g, j] holds channels 8h+4g..+3 of column 4l+j; output column c = 4l+j
    # takes channels 0-3, 4-7, 8-11, 12-15 from (g, h) = (0, 0), (1, 0), (0, 1), (1, 1): one 2-source shuffle
    outs = []
    for c in range(cols):
        l, j = divmod(c, 4)
        idx = [base + 4 * (2 * h + l) + k for h in (0, 1) for base in (0, lanes) for k in range(4)]
        outs.append(add(st2[0, j], st2[1, j], idx))
    return vals, outs


def _in_shuffle_network(A, B, dtype: str, lanes: int, cols: int) -> None:
    i64 = T.int64
    vals, outs = in_transpose_lanes(lanes, cols)
    env = [A.vload([i64(i), i64(0), i64(0)], f"{dtype}x{cols}") for i in range(lanes)]
    for a, b, idx in vals:
        env.append(T.Shuffle([env[a], env[b]], idx))
    for c, o in enumerate(outs):
        T.buffer_store(B, env[o], [i64(c), T.Ramp(i64(0), i64(1), lanes)])


def in_transpose_intrin(dtype: str, lanes: int, cols: int) -> str | None:
    """Name of the registered (lanes x cols) -> (cols x lanes) input transpose, None when this tile shape
    has no shuffle network here (only 16 channels x 8 columns: AVX-512 fp32)."""
    if (lanes, cols) != (IN_LANES, IN_COLS) or tvm.DataType(dtype).bits != 32:
        return None
    return _register_once(_in_name(dtype, lanes, cols), lambda impl: _build_in(dtype, lanes, cols, impl))


def _unit_stride_columns(block) -> bool:
    """Does the staging copy ``block`` (writing ``[..., w, c]``) read its source's columns at ``w`` plus a
    constant, so that 8 neighbouring output columns are 8 contiguous input elements (the intrinsic's vector
    load)? Not for a strided conv's subsampling copy (``2 * w``): ``tensorize`` refuses that tile, and TVM
    renders the whole module into the refusal's message (and prints a warning when it cannot)."""
    store = block.body
    if not isinstance(store, tvm.tirx.BufferStore) or len(store.indices) < 2:
        return False
    col = store.indices[-2]
    if not isinstance(col, tvm.tirx.Var):
        return False
    for region in block.reads:
        coeffs = tvm.sym.pattern.detect_linear_equation(region.region[-1].min, [col])
        if len(coeffs) != 2 or not isinstance(coeffs[0], tvm.tirx.IntImm) or int(coeffs[0]) != 1:
            return False
    return True


def transpose_load(sch, stage, lanes: int) -> bool:
    """Tensorize the NCHW -> NCHW[lanes]c staging copy ``stage`` of a pointwise conv's input (loops
    (..., w, c) with c the ``lanes`` vector loop) as (lanes x 8) register transposes: 8-column vector loads
    and whole-vector stores instead of one scalar load and insert per element. Tried on a copy first:
    False (schedule untouched) when the tile does not apply (width not a multiple of 8, other dtype, ...)."""
    dtype = str(sch.get(stage).writes[0].source.ty.dtype)
    name = in_transpose_intrin(dtype, lanes, IN_COLS)
    if name is None:
        return False

    *_, pw, _ = sch.get_loops(stage)
    width = sch.get(pw).extent
    if not isinstance(width, tvm.tirx.IntImm) or int(width) % IN_COLS:
        return False        # no whole 8-column tiles (checked first: a failed tensorize renders the module)
    if not _unit_stride_columns(sch.get(stage)):
        return False        # a strided gather (a stride-2 1x1 conv's subsampled input): no 8-column loads

    def apply(s):
        *_, pw, pci = s.get_loops(stage)
        _, wi = s.split(pw, [None, IN_COLS])
        s.reorder(pci, wi)
        s.tensorize(pci, name)

    return _apply_on_copy_first(sch, apply)       # else the staging keeps its gathered copy


# ---- output side: an NCHW[lanes]c tile of ``cols`` columns stored to NCHW in place ---------------------------

OUT_LANES = 16              # channels of the tile: AVX-512 fp32


def _out_name(dtype: str, cols: int, lanes: int) -> str:
    return f"ascendfuse_transpose_out_{cols}x{lanes}_{dtype}"


def _build_out(dtype: str, cols: int, lanes: int, impl: bool):
    """(cols columns x lanes channels) of an NCHW[lanes]c tile in UB -> (lanes channels x cols columns) of the
    NCHW output, each channel row a plane apart: description (a plain transpose block) or implementation
    (the 8 x 16 shuffle network on ``cols`` rows, the missing rows repeating the last, twice for 9 to 16
    columns; each channel row stored as one ``cols``-lane vector)."""
    i64 = T.int64
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("f")
            a, b = T.arg("a", T.handle()), T.arg("b", T.handle())
            A = T.match_buffer(a, (i64(cols), i64(lanes)), dtype, strides=[T.int64(), i64(1)], offset_factor=1,
                               scope="local.UB")
            # (channel, row, column): tensorize matches the trailing dims of the output's 4-d region
            B = T.match_buffer(b, (i64(lanes), i64(1), i64(cols)), dtype, strides=[T.int64(), T.int64(), i64(1)],
                               offset_factor=1)
            with T.sblock("root"):
                T.reads(A[i64(0):i64(cols), i64(0):i64(lanes)])
                T.writes(B[i64(0):i64(lanes), i64(0):i64(1), i64(0):i64(cols)])
                if impl:
                    _out_shuffle_network(A, B, dtype, cols, lanes)
                else:
                    with T.grid(i64(lanes), i64(cols)) as (i, j):
                        with T.sblock("transpose"):
                            vi, vj = T.axis.remap("SS", [i, j])
                            T.buffer_store(B, A[vj, vi], [vi, i64(0), vj])
    return ib.get()


def _out_shuffle_network(A, B, dtype: str, cols: int, lanes: int) -> None:
    i64 = T.int64
    if cols > ROWS:
        # two networks of 8 rows (columns 0-7, then 8 on, the missing rows repeating the last), each channel's
        # two 8-column halves joined into one vector: 11 and 13 columns (prime widths: SqueezeNet's 13x13
        # planes, 55 = 5 x 11), which no tile of 8 or fewer columns divides
        lo, hi = _out_channel_rows(A, dtype, 0, cols, lanes), _out_channel_rows(A, dtype, ROWS, cols, lanes)
        for r in range(lanes):
            T.buffer_store(B, T.Shuffle([lo[r], hi[r]], list(range(cols))),
                           [i64(r), i64(0), T.Ramp(i64(0), i64(1), cols)])
        return
    for r, vec in enumerate(_out_channel_rows(A, dtype, 0, cols, lanes, width=cols)):
        T.buffer_store(B, vec, [i64(r), i64(0), T.Ramp(i64(0), i64(1), cols)])


def _out_channel_rows(A, dtype: str, first: int, cols: int, lanes: int, width: int = ROWS) -> list:
    """Per channel, the ``width`` (<= 8) columns ``first``.. of the tile as one vector: the 8 x ``lanes``
    shuffle network on rows ``first``..``first`` + 7, the rows past ``cols`` repeating the last."""
    i64 = T.int64
    row = [A.vload([i64(min(first + i, cols - 1)), i64(0)], f"{dtype}x{lanes}") for i in range(ROWS)]

    def shuffle(x, y, idx):
        return T.Shuffle([x, y], list(idx))

    st1 = {(half, p): shuffle(row[2 * p], row[2 * p + 1], _unpack_ps(lanes, half)) for half in (0, 1)
           for p in range(ROWS // 2)}
    st2 = {(g, j): shuffle(st1[j // 2, 2 * g], st1[j // 2, 2 * g + 1], _unpack_pd(lanes, j))
           for g in range(ROWS // 4) for j in range(4)}
    out = []
    for r in range(lanes):
        q, j = divmod(r, 4)
        idx = [4 * q + k for k in range(4)] + [lanes + 4 * q + k for k in range(4)]
        out.append(shuffle(st2[0, j], st2[1, j], idx[:width]))
    return out


# Element types of the register transposes (shuffles only: any type works). float32 and the bytes of an int8
# depthwise conv, measured: without them a staged byte vector is 16 lane-strided loads and a stored one 16
# lane extracts (144-channel 3x3 at 56x56, Zen 5: 0.18 -> 0.10 ms with the transposed input).
STAGE_DTYPES = ("float32", "uint8", "int8")


def out_transpose_intrin(dtype: str, cols: int, lanes: int) -> str | None:
    """Name of the registered (cols x lanes) NCHW[lanes]c -> NCHW store intrinsic, None when this tile has no
    shuffle network here (STAGE_DTYPES, 8 or 16 lanes, 2..16 columns)."""
    if lanes not in STAGE_LANES or not 2 <= cols <= 2 * ROWS or dtype not in STAGE_DTYPES:
        return None
    return _register_once(_out_name(dtype, cols, lanes), lambda impl: _build_out(dtype, cols, lanes, impl))


def transpose_to_nchw(sch, copy, lanes: int) -> bool:
    """Tensorize ``copy``, a block storing an NCHW[lanes]c tile of one row and ``cols`` columns from UB into
    an NCHW buffer (loops (..., c, x) over lanes channels and cols columns), as one register transpose:
    ``cols`` whole-vector loads instead of one lane extract and scalar store per element. Tried on a copy
    first: False (schedule untouched) when the tile does not apply. A guarded copy (a column block that
    does not divide the width, so the last tile is predicated) is left as it is: TVM 0.27's tensorize fails
    an internal check on a predicated block instead of refusing it."""
    dtype = str(sch.get(copy).writes[0].source.ty.dtype)
    loops = sch.get_loops(copy)
    if len(loops) < 2 or predicated(sch, copy):
        return False
    cols, chans = (sch.get(lp).extent for lp in loops[-1:-3:-1])
    if not all(isinstance(e, tvm.tirx.IntImm) for e in (cols, chans)) or int(chans) != lanes:
        return False
    name = out_transpose_intrin(dtype, int(cols), lanes)
    if name is None:
        return False
    return _apply_on_copy_first(sch, lambda s: s.tensorize(s.get_loops(copy)[-2], name))


# ---- input side, predicated copies: NCHW rows -> NCHW[lanes]c staging, rewritten after scheduling ----------

STAGE_ANNOTATION = "ascendfuse.transpose_stage"   # on a staging copy block; value: columns per transpose


def mark_transposed_stage(sch, copy, lanes: int, cols: int) -> bool:
    """Prepare the staging copy ``copy`` (NCHW input -> NCHW[lanes]c, loops (..., w, c) with c the lanes)
    for ``rewrite_transposed_stages``: its width loop split by ``cols`` under the channel loop, and the block
    annotated. Such a copy may carry a predicate that tensorize cannot take: a copy computed at a tile whose
    input rows overlap the next tile's (a conv's halo rows), clipped at the image border, is predicated on
    its row loop, and ``blockize`` then derives wrong bindings for it (TVM 0.27: the tile offset is dropped
    or scaled by the row count). False (schedule untouched) when the width is not a multiple of ``cols``."""
    dtype = str(sch.get(copy).writes[0].source.ty.dtype)
    if dtype not in STAGE_DTYPES or lanes not in STAGE_LANES or not 2 <= cols <= IN_COLS:
        return False
    *_, pw, pc = sch.get_loops(copy)
    width, chans = sch.get(pw).extent, sch.get(pc).extent
    if not (isinstance(width, tvm.tirx.IntImm) and isinstance(chans, tvm.tirx.IntImm)):
        return False
    if int(width) % cols or int(chans) != lanes:
        return False
    _, wi = sch.split(pw, [None, cols])
    sch.reorder(pc, wi)
    sch.annotate(copy, STAGE_ANNOTATION, cols)
    return True


def rewrite_transposed_stages(func):
    """``func`` with every copy marked by ``mark_transposed_stage`` computed by register transposes: its
    (lanes channels x cols columns) loop nest becomes one block of ``lanes`` ``cols``-wide row loads, the
    16 x 8 shuffle network of ``in_transpose_lanes`` and ``cols`` whole-vector stores, under the copy's own
    predicate. A copy whose indices are not contiguous along both loops is left as it is. Returns the
    function and how many copies were rewritten."""
    import tvm_ffi
    from tvm import s_tir, sym, tirx

    done = []

    def on_for(loop):
        inner = loop.body
        if not isinstance(inner, tirx.For) or not isinstance(inner.body, s_tir.SBlockRealize):
            return loop
        realize = inner.body
        cols = realize.block.annotations.get(STAGE_ANNOTATION) if realize.block.annotations else None
        if cols is None:
            return loop
        new = _transposed_copy(realize, loop.loop_var, inner.loop_var, int(loop.extent), int(cols), sym, tirx,
                               s_tir)
        if new is None:
            return loop
        done.append(realize.block.name_hint)
        return new

    out = tvm_ffi.structural_map(func, (tvm.tirx.For, on_for))
    return out, len(done)


def _transposed_copy(realize, c_var, w_var, lanes, cols, sym, tirx, s_tir):
    block = realize.block
    store = block.body
    if lanes not in STAGE_LANES or not isinstance(store, tirx.BufferStore) or not isinstance(store.value, LOAD_TYPE):
        return None
    load = store.value
    if _uses(realize.predicate, (c_var, w_var)):
        return None
    bind = {iv.var: val for iv, val in zip(block.iter_vars, realize.iter_values)}
    ana = sym.Analyzer()
    ana.bind(c_var, tvm.ir.Range(0, lanes))
    ana.bind(w_var, tvm.ir.Range(0, cols))

    pairs = list(bind.items())

    def at(indices, c, w):
        return [ana.simplify(substitute_vars(substitute_vars(i, pairs), [(c_var, c), (w_var, w)])) for i in indices]

    zero = tirx.IntImm(c_var.ty.dtype if hasattr(c_var.ty, "dtype") else "int64", 0)

    def axes(indices):
        """(axis moving with the channel loop, axis moving with the width loop), each by +1 per step, every
        other axis fixed; None otherwise."""
        base = at(indices, zero, tirx.IntImm(str(zero.ty.dtype) if hasattr(zero, "ty") else "int64", 0))
        moving = at(indices, c_var, w_var)
        c_axis = w_axis = None
        for d, (b, m) in enumerate(zip(base, moving)):
            uses_c, uses_w = _uses(m, (c_var,)), _uses(m, (w_var,))
            if uses_c and uses_w:
                return None
            if uses_c:
                if c_axis is not None or not ana.can_prove_equal(m - b, c_var):
                    return None
                c_axis = d
            elif uses_w:
                if w_axis is not None or not ana.can_prove_equal(m - b, w_var):
                    return None
                w_axis = d
        return (c_axis, w_axis, base) if c_axis is not None and w_axis is not None else None

    src, dst = axes(load.indices), axes(store.indices)
    if src is None or dst is None or src[1] != len(load.indices) - 1 or dst[0] != len(store.indices) - 1:
        return None           # the rows must be contiguous in the source, the channels in the staging buffer
    i64 = lambda v: tirx.IntImm("int64", v)  # noqa: E731

    def moved(base, axis, step, width=1):
        idx = list(base)
        idx[axis] = idx[axis] + i64(step) if width == 1 else tirx.Ramp(idx[axis] + i64(step), i64(1), width)
        return idx

    rows = []
    for ch in range(lanes):
        v = tirx.BufferLoad(load.source, moved(moved(src[2], src[0], ch), src[1], 0, cols))
        if cols < IN_COLS:
            # repeat the load: a Shuffle's operands must hold at least as many lanes as it returns
            v = tirx.Shuffle([v] * -(-IN_COLS // cols),
                             [tirx.IntImm("int32", min(k, cols - 1)) for k in range(IN_COLS)])
        rows.append(v)
    vals, outs = in_transpose_lanes(lanes, IN_COLS)
    env = list(rows)
    for a, b, idx in vals:
        env.append(tirx.Shuffle([env[a], env[b]], [tirx.IntImm("int32", k) for k in idx]))
    stores = [tirx.BufferStore(store.buffer, env[outs[col]], moved(moved(dst[2], dst[1], col), dst[0], 0, lanes))
              for col in range(cols)]

    def region(base, c_axis, w_axis):
        return [tvm.ir.Range.from_min_extent(b, i64(lanes if d == c_axis else cols if d == w_axis else 1))
                for d, b in enumerate(base)]

    new_block = s_tir.SBlock([], [tirx.BufferRegion(load.source, region(src[2], src[0], src[1]))],
                             [tirx.BufferRegion(store.buffer, region(dst[2], dst[0], dst[1]))],
                             block.name_hint + "_transposed", tirx.SeqStmt(stores))
    return s_tir.SBlockRealize([], realize.predicate, new_block)


LOAD_TYPE = tvm.ir.expr.TensorLoad


def _uses(expr, variables) -> bool:
    import tvm_ffi

    found = []
    tvm_ffi.structural_walk(expr, (tvm.ir.Var, lambda v: found.append(v) if any(v.same_as(x) for x in variables)
                                   else None))
    return bool(found)


# ---- by name: a tuning database's traces tensorize with these intrinsics before any rule registered them ----

INTRIN_NAME = re.compile(r"ascendfuse_transpose\w*")
_BY_NAME = ((re.compile(r"ascendfuse_transpose_(\d+)x(\d+)_(\w+)"), transpose_intrin),
            (re.compile(r"ascendfuse_transpose_in_(\d+)x(\d+)_(\w+)"), in_transpose_intrin),
            (re.compile(r"ascendfuse_transpose_out_(\d+)x(\d+)_(\w+)"), out_transpose_intrin))


def register_named(name: str) -> bool:
    """Register intrinsic ``name`` as ``_name`` / ``_in_name`` spell it; False when it is none of ours."""
    for pattern, make in _BY_NAME:
        m = pattern.fullmatch(name)
        if m:
            return make(m[3], int(m[1]), int(m[2])) is not None
    return False
