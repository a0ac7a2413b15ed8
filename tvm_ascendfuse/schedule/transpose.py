"""Register transpose of a conv accumulator tile for its NCHW store.

The conv's register block keeps output channels on the vector lanes (NCHW[vl]c accumulator), the output is
NCHW (columns contiguous). Read with the columns on the lanes, every vector is ``rows`` lane-strided loads
(LLVM: one scalar load and insert per lane). This tensor intrinsic instead loads the ``rows`` accumulator
vectors once and transposes them with two-source shuffles (unpack ps, unpack pd, then two output rows per
full-width shuffle, stored whole): 3 shuffle stages instead of one load+insert per element.
"""

from __future__ import annotations

from tvm.s_tir import TensorIntrin
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


def _shuffle_network(A, B, dtype: str, rows: int, lanes: int) -> None:
    """Stores of the transposed tile. Expressions, not bindings: a bound vector becomes a local buffer,
    allocated per parallel task."""
    i64 = T.int64
    quads = lanes // 4
    row = [A.vload([i64(i), i64(0)], f"{dtype}x{lanes}") for i in range(rows)]

    def shuffle(x, y, idx):
        return T.Shuffle([x, y], list(idx))

    # stage 1 (unpacklo/hi_ps of row pairs): lane quad q holds rows 2p, 2p+1 of channels 4q+{0,1} / 4q+{2,3}
    lo = [k for q in range(quads) for k in (4 * q, lanes + 4 * q, 4 * q + 1, lanes + 4 * q + 1)]
    st1 = {(half, p): shuffle(row[2 * p], row[2 * p + 1], [k + 2 * half for k in lo]) for half in (0, 1)
           for p in range(rows // 2)}
    # stage 2 (unpacklo/hi_pd): c[g, j] lane quad q = rows 4g..4g+3 of channel 4q+j
    st2 = {}
    for g in range(rows // 4):
        for j in range(4):
            off = 2 * (j % 2)
            idx = [k for q in range(quads) for k in (4 * q + off, 4 * q + off + 1,
                                                     lanes + 4 * q + off, lanes + 4 * q + off + 1)]
            st2[g, j] = shuffle(st1[j // 2, 2 * g], st1[j // 2, 2 * g + 1], idx)

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
    name = _name(dtype, rows, lanes)
    try:
        TensorIntrin.get(name)
    except Exception:  # noqa: BLE001 - not registered yet
        desc, impl = (_build(dtype, rows, lanes, i) for i in (False, True))
        TensorIntrin.register(name, desc, impl)
    return name


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

    try:
        apply(sch.copy())
    except Exception:  # noqa: BLE001 - a tile the intrinsic does not match: keep the strided epilogue
        return False
    apply(sch)
    return True
