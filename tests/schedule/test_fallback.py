"""FallbackRule: whatever no other rule takes gets parallel loops, host-width vectors with tails, register tiles
for unmatched products, vector partial sums for row reductions and tiled transposes, and stays exact.

Every case is checked numerically against TVM's build of the unscheduled kernel (``check_rule``), on this
machine's host (``NATIVE``) unless it says otherwise, and structurally: the path the rule took (its note) and
the vector/parallel loops in the scheduled TIR, so a regression to scalar code fails here. Where the structure
depends on the vector width it is asserted for an AVX2 and an AVX-512 host too (``WIDTHS``: scheduled only,
code built for AVX-512 may not run here), with the lanes each host's vectors hold.
"""

import re

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.relax import op
from tvm.script import tirx as T

from tvm_ascendfuse.schedule.fallback import MIN_PARALLEL_WORK, FallbackRule
from tvm_ascendfuse.schedule.fast_math import use_fast_math
from tvm_ascendfuse.schedule.hostvec import host_vector

from .kernels import HOST, NATIVE, NPU, check_rule, fused_kernel

VECTOR, PARALLEL = tvm.tirx.ForKind.VECTORIZED, tvm.tirx.ForKind.PARALLEL
AVX2 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"})
AVX512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
WIDTHS = (NATIVE, AVX2, AVX512)


def schedule(build, shapes, dtype="float32", host=NATIVE, sizes=None, fixed=None):
    """(scheduled module, the rule's note) after the numeric check against the unscheduled kernel."""
    return check_rule(FallbackRule(), fused_kernel(build, shapes, dtype), host=host, sizes=sizes, fixed=fixed,
                      with_note=True)


def schedule_func(host, func):
    """(scheduled module, the rule's note): on ``NATIVE`` after the numeric check against the unscheduled
    kernel; for another host the schedule only (not run: this machine may lack its vectors)."""
    if host is NATIVE:
        return check_rule(FallbackRule(), func, host=NATIVE, with_note=True)
    result = FallbackRule().apply_with_note(use_fast_math(func), NPU, host)
    return result.sch.mod, result.note


def schedule_for(host, build, shapes, dtype="float32"):
    return schedule_func(host, fused_kernel(build, shapes, dtype))


def lanes_of(host, dtype="float32") -> int:
    return host_vector(host).lanes(dtype)


def test_the_hosts_cover_both_x86_widths():
    """The width-dependent checks below assert nothing new on a host whose features were lost."""
    assert [lanes_of(h) for h in (AVX2, AVX512)] == [8, 16]


def loops(mod) -> list:
    found = []
    tvm_ffi.structural_walk(mod["main"].body, (tirx.For, found.append))
    return found


def vector_widths(mod) -> list[int]:
    return sorted(int(f.extent) for f in loops(mod) if f.kind == VECTOR)


def has_parallel(mod) -> bool:
    return any(f.kind == PARALLEL for f in loops(mod))


def path_of(note: str, block: str) -> str:
    """The path the note gives for root block ``block``."""
    for part in note.removeprefix("fallback paths: ").split("; "):
        name, _, path = part.partition(": ")
        if name == block:
            return path
    raise AssertionError(f"no block {block} in {note!r}")


def stores(mod, dtype: str) -> list:
    """Stores into buffers of ``dtype`` (their value's lanes tell whether the store was vectorised)."""
    found = []
    tvm_ffi.structural_walk(mod["main"].body, (tirx.BufferStore, lambda s: found.append(s)
                                              if str(s.buffer.ty.dtype) == dtype else None))
    return found


# ---- elementwise: host-width vectors, the remainder as one shorter vector -------------------------------
def unary(a):
    return op.add(op.multiply(a, a), op.exp(a))


def _main_and_tail(n: int, lanes: int) -> list[int]:
    """Vector widths of a loop of ``n`` cut into full vectors and one shorter tail (a one-lane tail is scalar)."""
    return sorted({lanes} | ({n % lanes} if n % lanes > 1 else set()))


@pytest.mark.parametrize("width", [1, 3, 17, 33, 1000])
def test_odd_width_elementwise(width):
    """Rows of 17, 33 or 1000: host-width vectors and a tail vector (1000 = 62 x 16 + 8 on AVX-512). One and
    three columns are fused with the rows (contiguous), so even those run as vectors over the flattened rows."""
    for host in WIDTHS:
        mod, note = schedule_for(host, unary, [(64, width)])
        lanes = lanes_of(host)
        fused = _main_and_tail(64 * width, lanes)
        if width < lanes:
            assert vector_widths(mod) == fused, (host, note)
        else:
            # rows as wide as a vector or more may also run per row, a tail vector each
            assert sorted(set(vector_widths(mod)) - {1}) in (fused, _main_and_tail(width, lanes)), (host, note)


def test_row_width_not_a_multiple_of_lanes_has_main_and_tail_vectors():
    """Rows of 62 vectors and a half (1000 on AVX-512, 500 on AVX2): the full vectors and a tail vector."""
    for host in WIDTHS:
        lanes = lanes_of(host)
        width = 62 * lanes + lanes // 2
        # b broadcast: rows stay apart
        mod, note = schedule_for(host, lambda a, b: op.add(a, b), [(64, width), (width,)])
        assert path_of(note, "T_add") == f"elementwise, {lanes} lanes + tail {lanes // 2}", host
        assert vector_widths(mod) == [lanes // 2, lanes], (host, note)
        assert has_parallel(mod)


@pytest.mark.parametrize("dtype", ["float16", "int32", "int8"])
def test_elementwise_other_dtypes(dtype):
    """Lanes follow the element size: 32 fp16, 16 int32, 64 int8 per 512-bit vector, half as many per 256-bit."""
    for host in WIDTHS:
        mod, note = schedule_for(host, lambda a, b: op.add(op.multiply(a, b), b), [(64, 1000), (1000,)], dtype)
        lanes = host_vector(host).bits // tvm.DataType(dtype).bits
        assert max(vector_widths(mod)) == lanes, (host, note)
        assert 1000 % lanes in vector_widths(mod) or 1000 % lanes == 0, (host, note)


def test_portable_host_uses_four_lanes():
    mod, note = schedule(lambda a, b: op.add(a, b), [(64, 1001), (1001,)], host=HOST)
    assert vector_widths(mod) == [4], note           # 1001 = 250 x 4 + 1: a one-lane tail stays scalar


def test_symbolic_width_is_left_to_llvm_and_exact():
    n = tirx.Var("n", "int64")
    for size in (1, 17, 1000):
        mod, note = schedule(unary, [(8, n)], sizes={"n": size})
    assert path_of(note, "T_add").startswith("elementwise"), note


def test_bool_stores_stay_scalar():
    """LLVM cannot store bool vectors through TVM's lowering (StorageRewrite retypes them to int8 vectors):
    a kernel writing bool is never vectorised, on any path."""
    mod, _ = schedule(lambda a, b: op.greater(a, b), [(64, 1000), (64, 1000)])
    assert all(s.value.ty.lanes == 1 if hasattr(s.value.ty, "lanes") else True for s in stores(mod, "bool"))
    assert vector_widths(mod) == []
    mod, _ = schedule(lambda a: op.logical_not(a), [(64, 1000)], "bool")
    assert vector_widths(mod) == []


def test_tiny_kernels_run_serial_and_big_ones_in_parallel():
    small, _ = schedule(unary, [(4, 64)])
    assert 4 * 64 < MIN_PARALLEL_WORK and not has_parallel(small)
    big, _ = schedule(unary, [(256, 128)])
    assert has_parallel(big)


def test_one_long_row_is_shared_by_the_cores():
    for host in WIDTHS:
        mod, note = schedule_for(host, unary, [(1, 100003)])
        assert has_parallel(mod) and lanes_of(host) in vector_widths(mod), (host, note)


# ---- transposes: both axes tiled by a cache line ----------------------------------------------------------
@pytest.mark.parametrize("shape,axes", [
    ((64, 96), [1, 0]),
    ((50, 33), [1, 0]),                    # tiles with a remainder on both axes
    ((2, 32, 24, 48), [0, 3, 1, 2]),       # NHWC -> NCHW
    ((2, 48, 32, 24), [0, 2, 3, 1]),       # NCHW -> NHWC
    ((3, 20, 16, 40), [2, 0, 3, 1]),
])
def test_transpose_tiles_both_axes(shape, axes):
    mod, note = schedule(lambda a: op.multiply(op.permute_dims(a, axes), tvm.relax.const(2.0, "float32")),
                         [shape])
    path = path_of(note, "T_multiply")
    assert path.startswith("transpose, 16x"), note
    inner = [f for f in loops(mod) if f.kind == VECTOR]
    if path.endswith("vectorised"):
        assert inner and int(inner[0].extent) <= 16


def test_transpose_fp16_uses_a_line_of_32():
    mod, note = schedule(lambda a: op.permute_dims(a, [1, 0]), [(64, 96)], "float16")
    assert path_of(note, "T_transpose") == "transpose, 32x32 tiles, vectorised", note


def test_a_plain_copy_is_not_a_transpose():
    _, note = schedule(lambda a: op.reshape(a, (32, 64)), [(64, 32)])
    assert path_of(note, "T_reshape").startswith("elementwise"), note


# ---- reductions -------------------------------------------------------------------------------------------
REDUCE = {"sum": op.sum, "max": op.max, "mean": op.mean}


@pytest.mark.parametrize("kind", sorted(REDUCE))
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_inner_axis_reduction_uses_vector_partial_sums(kind, keepdims, dtype):
    """Rows of 768 fp32 (48 AVX-512 vectors) or 160 fp16 (5: fp16 sums of longer rows differ from the
    unscheduled order by more than fp16's tolerance, in either order); partial sums as wide as a vector."""
    width = 768 if dtype == "float32" else 160
    for host in WIDTHS:
        mod, note = schedule_for(host, lambda a: REDUCE[kind](a, axis=[1], keepdims=keepdims), [(96, width)], dtype)
        red = next(p for p in note.removeprefix("fallback paths: ").split("; ") if "row" in p)
        lanes = lanes_of(host, dtype)
        assert red.endswith(f"row, {lanes}-lane partial sums"), (host, note)
        assert lanes in vector_widths(mod), (host, note)


@pytest.mark.parametrize("kind", sorted(REDUCE))
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_outer_axis_reduction_accumulates_vectors(kind, keepdims, dtype):
    """A reduction over the leading axis: the reduction loop outside, the contiguous columns in vector
    registers (each column sums in the unscheduled order: exact)."""
    mod, note = schedule(lambda a: REDUCE[kind](a, axis=[0], keepdims=keepdims), [(64, 96)], dtype)
    red = next(p for p in note.removeprefix("fallback paths: ").split("; ") if "accumulate" in p)
    assert "lanes" in red, note
    assert vector_widths(mod), note


def _reduce_extents(mod, prefix: str) -> list[int]:
    """Extents of the reduction iterators of the update block named ``prefix``..."""
    found = []
    tvm_ffi.structural_walk(mod["main"].body, (tvm.s_tir.SBlock, lambda b: found.extend(
        int(iv.dom.extent) for iv in b.iter_vars if iv.iter_type == tirx.IterVar.CommReduce)
        if b.name_hint.startswith(prefix) and not b.name_hint.endswith("_init") else None))
    return found


def test_mean_over_a_plane_fuses_its_axes():
    """Global average pooling: H x W (14 x 14 = 196) fused into one row of partial sums as wide as the widest
    divisor of 196 within a vector (14 lanes on AVX-512, 7 on AVX2), summed over 14 / 28 chunks of the row."""
    for host in WIDTHS:
        mod, note = schedule_for(host, lambda a: op.mean(a, axis=[2, 3], keepdims=True), [(1, 64, 14, 14)])
        lanes = max(d for d in range(4, lanes_of(host) + 1) if 196 % d == 0)
        assert f"row, {lanes}-lane partial sums" in note, (host, note)
        assert _reduce_extents(mod, "p0_red_rf") == [196 // lanes], (host, note)     # one axis: the whole plane


def test_middle_axis_reduction():
    _, note = schedule(lambda a: op.sum(a, axis=[1]), [(8, 50, 40)])
    assert "accumulate" in note, note


def test_int_sum_and_odd_rows():
    check_rule(FallbackRule(), fused_kernel(lambda a: op.sum(a, axis=[1]), [(7, 37)], "int32"), host=NATIVE)
    check_rule(FallbackRule(), fused_kernel(lambda a: op.max(a, axis=[0]), [(37, 7)], "int32"), host=NATIVE)


def test_symbolic_reductions():
    n = tirx.Var("n", "int64")
    for axis in (0, 1):
        check_rule(FallbackRule(), fused_kernel(lambda a: op.sum(a, axis=[axis]), [(n, 40)]), host=NATIVE,
                   sizes={"n": 13})
        check_rule(FallbackRule(), fused_kernel(lambda a: op.max(a, axis=[axis]), [(24, n)]), host=NATIVE,
                   sizes={"n": 37})


def test_argmax_runs_its_rows_in_parallel():
    mod, note = schedule(lambda a: op.argmax(a, axis=1), [(512, 300)])
    assert has_parallel(mod), note


# ---- products no rule matched ----------------------------------------------------------------------------
def test_unmatched_gemm_register_tiles():
    """A GEMM behind a head-merge layout change: rows of the output reuse each vector of the weight; the
    tile of partial sums sits in UB (registers) and is written back once."""
    from .test_matmul import head_merge_linear

    func = fused_kernel(head_merge_linear(4, 40, 16), [(1, 4, 40, 16), (64, 48), (48,), (1, 40, 48)])
    for host in WIDTHS:
        mod, note = schedule_func(host, func)
        path = path_of(note, "matmul")
        tile = re.fullmatch(r"accumulate (\d+) rows \(operand reused\) x (\d+)x(\d+) lanes", path)
        assert tile, (host, note)
        rows, vectors, lanes = (int(g) for g in tile.groups())
        # the weight's vectors reused across rows, the tile within the registers the host keeps sums in
        assert lanes == lanes_of(host) and rows >= 2, (host, note)
        assert rows * vectors <= host_vector(host).accumulators, (host, note)
        assert lanes in vector_widths(mod) and has_parallel(mod), (host, note)
        assert any(b.scope == "local.UB" for b in _allocations(mod)), f"{host}: the tile of partial sums is not staged"


def _allocations(mod) -> list:
    found = []
    tvm_ffi.structural_walk(mod["main"].body, (tvm.s_tir.SBlock, lambda b: found.extend(
        v.ty for v in b.alloc_buffers)))
    return [type("B", (), {"scope": t.storage_scope})() for t in found]


@pytest.mark.parametrize("m,k,n", [(9, 13, 7), (37, 64, 48), (64, 40, 1000)])
def test_matmul_shapes(m, k, n):
    check_rule(FallbackRule(), fused_kernel(lambda a, b: op.matmul(a, b), [(m, k), (k, n)]), host=NATIVE)


def test_matmul_fp16():
    check_rule(FallbackRule(), fused_kernel(lambda a, b: op.matmul(a, b), [(24, 40), (40, 96)], "float16"),
               host=NATIVE)


def test_unmatched_gemm_with_symbolic_rows():
    n = tirx.Var("n", "int64")
    check_rule(FallbackRule(), fused_kernel(lambda a, b: op.matmul(a, b), [(1, n, 24), (24, 40)]), host=NATIVE,
               sizes={"n": 13})


def test_gemv_sums_rows_in_vectors():
    """y = A.x: the output axis gathers A (stride K), so the row path takes it: partial sums a vector wide."""
    for host in WIDTHS:
        mod, note = schedule_for(host, lambda a, x: op.matmul(a, x), [(64, 256), (256,)])
        assert f"row, {lanes_of(host)}-lane partial sums" in note, (host, note)


# {host fp32 lanes: {stride: register tile}}: the widest vectors dividing the 120 / 60 output columns, up to
# four of them, and as many output channels as the host's accumulator registers then hold
CONV1D_TILES = {16: {1: "4 rows (operand reused) x 4x15 lanes", 2: "4 rows (operand reused) x 4x15 lanes"},
                8: {1: "2 rows (operand reused) x 3x8 lanes", 2: "4 rows (operand reused) x 2x6 lanes"}}


@pytest.mark.parametrize("stride", [1, 2])
def test_conv1d_register_tiles_and_deinterleaves_strided_input(stride):
    """conv1d (Whisper's front end): output channels reuse each input vector. With stride 2 the padded input
    is re-laid out (w % 2, w // 2) by its producer so the vectors read it contiguously."""
    def build(x, w):
        return op.nn.conv1d(x, w, strides=stride, padding=1)

    for host in WIDTHS:
        mod, note = schedule_for(host, build, [(1, 16, 120), (32, 16, 3)])
        tile = CONV1D_TILES[lanes_of(host)][stride]
        assert path_of(note, "conv1d_ncw") == f"accumulate {tile}", (host, note)
        pads = [b for b in _buffers(mod) if b.name == "pad_temp"]
        assert len(pads[0].ty.shape) == (4 if stride == 2 else 3), (host, pads[0].ty.shape)


def _buffers(mod) -> list:
    found = []
    tvm_ffi.structural_walk(mod["main"].body, (tvm.s_tir.SBlock, lambda b: found.extend(b.alloc_buffers)))
    return found


def test_grouped_and_depthwise_conv():
    def grouped(x, w):
        return op.nn.conv2d(x, w, padding=1, groups=4)

    check_rule(FallbackRule(), fused_kernel(grouped, [(1, 16, 14, 14), (16, 4, 3, 3)]), host=NATIVE)

    def depthwise(x, w):
        return op.nn.relu(op.nn.conv2d(x, w, strides=2, padding=2, groups=24))

    mod, note = schedule(depthwise, [(1, 24, 28, 28), (24, 1, 5, 5)])
    assert "accumulate" in path_of(note, "group_conv2d_nchw"), note


def test_pooling_and_concat_after_a_conv():
    def build(x, w):
        y = op.nn.conv2d(x, w)
        return op.concat([op.nn.avg_pool2d(y, (2, 2), (2, 2)), op.nn.max_pool2d(y, (2, 2), (2, 2))], axis=1)

    check_rule(FallbackRule(), fused_kernel(build, [(1, 32, 28, 28), (16, 32, 1, 1)]), host=NATIVE)


# ---- whatever else ---------------------------------------------------------------------------------------
CASES = {
    "take": ([(10, 6), (5,)], "float32", lambda a, i: op.take(a, op.astype(i, "int32"), axis=0)),
    "max_pool": ([(1, 3, 9, 9)], "float32", lambda a: op.nn.max_pool2d(a, (3, 3), (2, 2))),
    "flip": ([(16, 300)], "float32", lambda a: op.flip(a, axis=1)),
    "strided_slice": ([(16, 300)], "float32", lambda a: op.strided_slice(a, axes=[1], begin=[1], end=[299],
                                                                        strides=[3])),
    "resize": ([(1, 3, 17, 23)], "float32", lambda a: op.image.resize2d(a, (31, 45), layout="NCHW")),
    "layer_norm_with_sum_output": ([(64, 96), (64, 96), (96,), (96,)], "float32",
                                   lambda a, b, g, c: tvm.relax.Tuple([op.nn.layer_norm(op.add(a, b), g, c, [1]),
                                                                       op.add(a, b)])),
    "softmax": ([(33, 50)], "float32", lambda a: op.nn.softmax(a, axis=-1)),
    "where": ([(64, 100), (64, 100)], "float32", lambda a, b: op.where(op.greater(a, b), a, b)),
    "concat_odd": ([(3, 17), (3, 5)], "float32", lambda a, b: op.concat([a, b], axis=1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_unscheduled(case):
    shapes, dtype, build = CASES[case]
    fixed = {1: np.array([0, 3, 9, 2, 1], "float32")} if case == "take" else None   # in-range indices
    check_rule(FallbackRule(), fused_kernel(build, shapes, dtype), host=NATIVE, fixed=fixed)
    check_rule(FallbackRule(), fused_kernel(build, shapes, dtype), host=HOST, fixed=fixed)


def test_add_layer_norm_sums_rows_in_vectors():
    """GPT-2's add + LayerNorm with the sum as a second output (the reduction rule declines it): row sums as
    partials a vector wide, both elementwise stages vectorised."""
    build = CASES["layer_norm_with_sum_output"][2]
    for host in WIDTHS:
        mod, note = schedule_for(host, build, [(128, 768), (128, 768), (768,), (768,)])
        lanes = lanes_of(host)
        assert note.count(f"row, {lanes}-lane partial sums") == 2, (host, note)
        for block in ("T_add", "T_layer_norm"):
            assert path_of(note, block).startswith(f"elementwise, {lanes} lanes"), (host, note)
        assert has_parallel(mod)


def test_never_fails_on_opaque_tir():
    @T.prim_func(s_tir=True)
    def opaque(a: T.handle, b: T.handle):
        A = T.match_buffer(a, (16,), "float32")
        B = T.match_buffer(b, (16,), "float32")
        for i in range(16):
            B[i] = A[i] + T.float32(1)       # no blocks at all

    sch = FallbackRule().apply(opaque.with_attr("global_symbol", "main"), NPU, NATIVE)
    assert sch is None or sch.mod["main"] is not None


# ---- integer and bool kernels on every path ------------------------------------------------------------
INT_CASES = {
    "transpose_int32": ([(50, 33)], "int32", lambda a: op.permute_dims(a, [1, 0])),
    "transpose_int8": ([(2, 48, 32, 24)], "int8", lambda a: op.permute_dims(a, [0, 2, 3, 1])),
    "transpose_bool": ([(64, 96)], "bool", lambda a: op.permute_dims(a, [1, 0])),
    "broadcast_int8_odd": ([(33, 1001), (1001,)], "int8", lambda a, b: op.add(a, b)),
    "broadcast_int32_column": ([(64, 37), (64, 1)], "int32", lambda a, b: op.multiply(a, b)),
    "bool_and_odd": ([(17, 130), (130,)], "bool", lambda a, b: op.logical_and(a, b)),
    "sum_int8_rows": ([(24, 257)], "int32", lambda a: op.sum(op.astype(a, "int8"), axis=[1])),
    "max_int32_cols": ([(257, 24)], "int32", lambda a: op.max(a, axis=[0])),
    "compare_to_int": ([(64, 1000), (64, 1000)], "float32",
                       lambda a, b: op.astype(op.greater(a, b), "int32")),
}


@pytest.mark.parametrize("case", sorted(INT_CASES))
def test_integer_and_bool_kernels_are_exact(case):
    shapes, dtype, build = INT_CASES[case]
    mod, note = schedule(build, shapes, dtype)
    if dtype == "bool":
        assert vector_widths(mod) == [], note
