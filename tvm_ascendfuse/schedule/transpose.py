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
from tvm.s_tir import ScheduleError, TensorIntrin
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script.builder import ir as T

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
    try:
        TensorIntrin.get(name)
    except ValueError:      # not registered yet
        TensorIntrin.register(name, build(False), build(True))
    return name


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

    def apply(s):
        *_, pw, pci = s.get_loops(stage)
        _, wi = s.split(pw, [None, IN_COLS])
        s.reorder(pci, wi)
        s.tensorize(pci, name)

    return _apply_on_copy_first(sch, apply)       # else the staging keeps its gathered copy


# ---- by name: a tuning database's traces tensorize with these intrinsics before any rule registered them ----

INTRIN_NAME = re.compile(r"ascendfuse_transpose\w*")
_BY_NAME = ((re.compile(r"ascendfuse_transpose_(\d+)x(\d+)_(\w+)"), transpose_intrin),
            (re.compile(r"ascendfuse_transpose_in_(\d+)x(\d+)_(\w+)"), in_transpose_intrin))


def register_named(name: str) -> bool:
    """Register intrinsic ``name`` as ``_name`` / ``_in_name`` spell it; False when it is none of ours."""
    for pattern, make in _BY_NAME:
        m = pattern.fullmatch(name)
        if m:
            return make(m[3], int(m[1]), int(m[2])) is not None
    return False
