"""GemmNormRule: matmul + bias + residual + LayerNorm/RMSNorm in one kernel, against the unscheduled kernel."""

import pytest
from tvm import relax
from tvm.relax import op

from tvm_ascendfuse.schedule.reduction import GemmNormRule

from .kernels import NATIVE, NPU, check_rule, fused_kernel


def proj_add_ln(m, k, n):
    return ([(m, k), (k, n), (n,), (m, n), (n,), (n,)],
            lambda x, w, b, r, g, be: op.nn.layer_norm(op.add(op.add(op.matmul(x, w), b), r), g, be, [-1]))


def proj_rms(m, k, n):
    return ([(m, k), (k, n), (m, n), (n,)],
            lambda x, w, r, g: op.nn.rms_norm(op.add(op.matmul(x, w), r), g, [-1]))


@pytest.mark.parametrize("shapes_build", [proj_add_ln(16, 32, 64), proj_add_ln(7, 19, 33), proj_rms(12, 16, 48)])
def test_matches_unscheduled(shapes_build):
    shapes, build = shapes_build
    check_rule(GemmNormRule(), fused_kernel(build, shapes))


def test_residual_sum_as_second_output():
    """LLaMA's o-proj: the residual sum is both returned and normalised (two outputs)."""
    from tvm import relax

    def build(x, w, r, g):
        h = op.add(op.matmul(x, w), r)
        return relax.Tuple([h, op.nn.rms_norm(h, g, [-1])])

    _, note = check_rule(GemmNormRule(), fused_kernel(build, [(1, 12, 16), (16, 48), (1, 12, 48), (48,)]), host=NATIVE,
                         with_note=True)
    assert note and "second output" in note


def test_avx512_widths():
    shapes, build = proj_add_ln(32, 64, 128)
    mod = check_rule(GemmNormRule(), fused_kernel(build, shapes), host=NATIVE)
    assert "T.parallel" in mod.script()


def test_declines_plain_norm_and_plain_matmul():
    rule = GemmNormRule()
    assert rule.apply(fused_kernel(lambda x, g, b: op.nn.layer_norm(x, g, b, [-1]), [(4, 8), (8,), (8,)]),
                      NPU, None) is None
    assert rule.apply(fused_kernel(lambda a, b: op.matmul(a, b), [(8, 16), (16, 4)]), NPU, None) is None


def test_declines_a_conv_of_batch_one_beside_a_pool():
    """DLA's downsampling kernel (strided conv + bias + ReLU, a max-pool of the same input beside it): the
    normal form drops the batch of 1 and the conv looked like one contraction; this rule ran it as an untiled
    loop nest at 2.3 GFLOP/s. It belongs to the conv/pool rules."""
    def build(x, w, b):
        y = op.nn.relu(op.add(op.nn.conv2d(x, w, strides=2, padding=[1] * 4), b))
        return relax.Tuple([y, op.nn.max_pool2d(x, pool_size=2, strides=2)])
    func = fused_kernel(build, [(1, 16, 28, 28), (32, 16, 3, 3), (1, 32, 1, 1)])
    check_rule(GemmNormRule(), func, host=NATIVE, expect=False)


def test_swiglu_two_products():
    from tvm_ascendfuse.schedule.multi_gemm import MultiGemmRule

    build = lambda x, wg, wu: op.multiply(op.nn.silu(op.matmul(x, wg)), op.matmul(x, wu))  # noqa: E731
    check_rule(MultiGemmRule(), fused_kernel(build, [(1, 16, 32), (32, 64), (32, 64)]), host=NATIVE)
    check_rule(MultiGemmRule(), fused_kernel(build, [(9, 12), (12, 20), (12, 20)]))
    assert MultiGemmRule().apply(fused_kernel(lambda a, b: op.matmul(a, b), [(8, 16), (16, 4)]), NPU, None) is None


def convnext_head(n, h, w, k, c):
    """ConvNeXt's last block and head: linear on channels-last rows -> permute to NCHW -> layer scale ->
    + residual -> global average pool -> LayerNorm over the pooled channels (NHWC (n, 1, 1, c))."""
    shapes = [(n, h, w, k), (k, c), (c,), (c, 1, 1), (n, c, h, w), (c,), (c,)]

    def build(x, wt, b, scale, res, g, be):
        y = op.add(op.multiply(scale, op.permute_dims(op.add(op.matmul(x, wt), b), [0, 3, 1, 2])), res)
        pooled = op.mean(y, axis=[2, 3], keepdims=True)
        return op.nn.layer_norm(op.permute_dims(pooled, [0, 2, 3, 1]), g, be, [-1])
    return shapes, build


def _redundancy(mod):
    """Largest ratio, over the blocks, of the iterations their loops run to the block's own domain."""
    import math

    from tvm import tirx
    worst = 1.0

    def visit(stmt, trip):
        nonlocal worst
        if isinstance(stmt, tirx.For):
            visit(stmt.body, trip * int(stmt.extent))
        elif isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, trip)
        elif hasattr(stmt, "block") and hasattr(stmt.block, "iter_vars") and not stmt.block.iter_vars \
                and stmt.block.name_hint != "root":
            visit(stmt.block.body, trip)        # a loop partition's wrapper: its loops' blocks are counted
        elif hasattr(stmt, "block") and hasattr(stmt.block, "iter_vars"):
            dom = math.prod(int(iv.dom.extent) for iv in stmt.block.iter_vars)
            if stmt.block.name_hint != "root":
                worst = max(worst, trip / max(1, dom))
            visit(stmt.block.body, trip if stmt.block.name_hint == "root" else 1)
        elif hasattr(stmt, "body"):
            visit(stmt.body, trip)
    visit(mod["main"].body, 1)
    return worst


@pytest.mark.parametrize("dims", [(1, 7, 7, 96, 48), (2, 3, 5, 40, 24), (1, 4, 4, 32, 20)])
def test_pooled_norm_after_the_gemm_computed_once(dims):
    """A pooling reduction over the GEMM's rows then a norm over the pooled vector: no common row loop, so
    each block runs once (placed under the norm's column loop they were recomputed once per column)."""
    shapes, build = convnext_head(*dims)
    mod = check_rule(GemmNormRule(), fused_kernel(build, shapes))
    assert _redundancy(mod) <= 2, _redundancy(mod)


def scores_from_packed_qkv(heads, d, s):
    """Attention scores + softmax with Kᵀ cut inside the kernel from a packed Q|K|V projection (Whisper's
    encoder: 1500 keys): strided_slice -> reshape into heads -> transpose -> matmul -> softmax."""
    shapes = [(heads, s, d), (1, s, 3 * heads * d)]

    def build(q, qkv):
        k = op.strided_slice(qkv, axes=[2], begin=[heads * d], end=[2 * heads * d])
        kt = op.permute_dims(op.reshape(k, (s, heads, d)), [1, 2, 0])
        return op.nn.softmax(op.matmul(q, kt), -1)
    return shapes, build


def _gemm_vector_widths(mod):
    """Lane counts of the vector loops that run the product's register block (its update block)."""
    from tvm import tirx

    widths = []

    def visit(stmt, vec):
        if isinstance(stmt, tirx.For):
            lanes = int(stmt.extent) if stmt.kind == tirx.ForKind.VECTORIZED else vec
            visit(stmt.body, lanes)
        elif isinstance(stmt, tirx.SeqStmt):
            for x in stmt.seq:
                visit(x, vec)
        elif hasattr(stmt, "block") and hasattr(stmt.block, "iter_vars"):
            blk = stmt.block
            if blk.name_hint.startswith("matmul") and not blk.name_hint.endswith("_init") and vec is not None \
                    and any(iv.iter_type == tirx.IterVar.CommReduce for iv in blk.iter_vars):
                widths.append(vec)
            visit(blk.body, None if blk.name_hint == "root" else vec)
        elif hasattr(stmt, "body"):
            visit(stmt.body, vec)
    visit(mod["main"].body, None)
    return widths


def _stage_shapes(mod):
    """Shapes of the buffers the kernel allocates at its root: the staged (padded) Kᵀ is one of them."""
    return [tuple(int(d) for d in b.shape) for b in mod["main"].body.block.alloc_buffers]


@pytest.mark.parametrize("host,heads,d,s", [(NATIVE, 2, 16, 60), (NATIVE, 1, 8, 100), (None, 2, 8, 50),
                                            (NATIVE, 2, 16, 64)])
def test_scores_from_packed_projection(host, heads, d, s):
    """Kᵀ is staged once, whole ([heads, d, keys]: 64 keys), zero-padded to full vectors when no full vector
    divides the key count (60, 100, 50); the product's register block runs on full host vectors."""
    from tvm_ascendfuse.schedule.common import vector_lanes

    from .kernels import HOST

    host = host or HOST
    lanes = vector_lanes(host, 32)
    shapes, build = scores_from_packed_qkv(heads, d, s)
    mod = check_rule(GemmNormRule(), fused_kernel(build, shapes), host=host)
    stages = [sh for sh in _stage_shapes(mod) if sh[:2] == (heads, d)]
    assert len(stages) == 1 and stages[0][2] % lanes == 0 and s <= stages[0][2] < s + 2 * lanes, _stage_shapes(mod)
    widths = _gemm_vector_widths(mod)
    assert widths and all(w == lanes for w in widths), widths


def _root_loop_of(mod, prefix):
    """Index of the root-level statement (loop nest) holding the first block named ``prefix``..."""
    import tvm_ffi
    from tvm import s_tir, tirx

    body = mod["main"].body.block.body
    seq = body.seq if isinstance(body, tirx.SeqStmt) else [body]
    for pos, stmt in enumerate(seq):
        names = []
        tvm_ffi.structural_walk(stmt, (s_tir.SBlockRealize, lambda r: names.append(r.block.name_hint)), order="pre")
        if any(n.startswith(prefix) for n in names):
            return pos
    return None


def test_scores_computed_per_row_block_before_their_softmax():
    """Scores bigger than the cache (2 x 300 x 320 x 4 B > 512 KiB of L1) with a Kᵀ panel that fits: the
    product is computed per block of rows right before the softmax of those rows (one loop nest), so the
    scores never round-trip through memory, its register block on full host vectors; numerically the same
    as the unscheduled kernel. The structure also on an AVX2 and an AVX-512 host (scheduled, not run)."""
    import tvm

    from tvm_ascendfuse.schedule.common import vector_lanes
    from tvm_ascendfuse.schedule.fast_math import use_fast_math

    shapes, build = scores_from_packed_qkv(2, 16, 300)
    func = fused_kernel(build, shapes)
    avx2, avx512 = (tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": cpu})
                    for cpu in ("haswell", "skylake-avx512"))
    for host in (NATIVE, avx2, avx512):
        if host is NATIVE:
            mod = check_rule(GemmNormRule(), func, host=NATIVE)
        else:
            mod = GemmNormRule().apply_with_note(use_fast_math(func), NPU, host).sch.mod
        assert _root_loop_of(mod, "matmul") == _root_loop_of(mod, "T_softmax_norm") is not None, host
        widths = _gemm_vector_widths(mod)
        assert widths and all(w == vector_lanes(host, 32) for w in widths), (host, widths)
    staged = check_rule(GemmNormRule(row_blocks=False), fused_kernel(build, shapes), host=NATIVE)
    assert _root_loop_of(staged, "matmul") != _root_loop_of(staged, "T_softmax_norm")


def _register_blocks(mod):
    """(rows, vectors) of every unrolled x vectorised accumulator nest in a scheduled kernel."""
    from tvm import tirx
    import tvm_ffi

    found = []

    def visit(loop):
        if loop.kind == tirx.ForKind.UNROLLED and isinstance(loop.body, tirx.For) \
                and loop.body.kind == tirx.ForKind.UNROLLED and isinstance(loop.body.body, tirx.For) \
                and loop.body.body.kind == tirx.ForKind.VECTORIZED:
            found.append((int(loop.extent), int(loop.body.extent)))

    tvm_ffi.structural_walk(mod["main"], (tirx.For, visit))
    return found


def test_rows_the_default_block_does_not_divide_keep_accumulators_busy():
    """7 x 7 pixels (ConvNeXt's last stage): the default 4-row block does not divide 7 rows, and its largest
    divisor (1 row x 4 vectors) leaves the FMAs waiting on loads; 7 rows x 2 vectors divide and fill 14."""
    from tvm_ascendfuse.schedule.contraction import dividing_block

    assert dividing_block(7, 768, 16, 16, (1, 4)) == (7, 2)
    assert dividing_block(197, 128, 16, 16, (1, 2)) == (1, 8)          # a prime row count: one row, widest
    shapes = [(1, 7, 7, 64), (64, 96), (96,), (1, 7, 7, 96), (96,), (96,)]
    build = lambda x, w, b, r, g, be: op.nn.layer_norm(op.add(op.add(op.matmul(x, w), b), r), g, be, [-1])
    mod = check_rule(GemmNormRule(), fused_kernel(build, shapes), host=NATIVE)
    assert (7, 2) in _register_blocks(mod), _register_blocks(mod)


def test_residual_output_then_norm_read_as_a_window_of_rows():
    """Swin's block end: matmul + bias + residual (the sum also leaves the kernel), LayerNorm, then the next
    block's cyclic shift of the normalised rows (a concat of two row slices). The norm runs once per row and
    the shift after it; the bias add in front of the residual output is inlined."""
    from tvm import relax

    def build(x, w, b, r, g, be):
        h = op.add(op.add(op.matmul(x, w), b), r)
        n = op.nn.layer_norm(h, g, be, [-1])
        rolled = op.concat([op.strided_slice(n, [1], [6], [9]), op.strided_slice(n, [1], [0], [6])], axis=1)
        return relax.Tuple([h, rolled])

    shapes = [(1, 9, 9, 32), (32, 48), (48,), (1, 9, 9, 48), (48,), (48,)]
    check_rule(GemmNormRule(), fused_kernel(build, shapes), host=NATIVE)


def _proj_add_ln_model(m, k, n, seed=0, lead=()):
    """layer_norm(x W + b + r): the FFN's down projection with its residual and norm, W a constant; ``lead``:
    leading unit axes of x and r (a Transformer's batch of one)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((*lead, m, k), "float32"))
    r = relax.Var("r", relax.TensorType((*lead, m, n), "float32"))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            h = op.add(op.add(op.matmul(x, relax.const(w)), relax.const(b)), r)
            ones, zeros = relax.const(np.ones(n, "float32")), relax.const(np.zeros(n, "float32"))
            out = bb.emit_output(op.nn.layer_norm(h, ones, zeros, [-1]))
        bb.emit_func_output(out)
    return bb.get(), w, b



def _gemm_norm_notes(res):
    rows = [k for k in res.report.kernels if k.get("rule") == "matmul+norm"]
    notes = res.report.sections.get("schedule_notes", {})
    return rows, [n for k in rows for n in notes.get(k["name"], [])]


@pytest.mark.parametrize("lead", [(), (1,)], ids=["2d", "batch_of_one"])
def test_bf16_build_runs_the_gemm_on_the_dot_product(lead, monkeypatch):
    """A force_bf16 build on a host with AVX512-BF16: the GEMM stage of GEMM + residual + LayerNorm on the bf16
    dot product, its numbers the bf16-rounded operands' (float32 sums); a float32 build keeps float32 FMAs.
    With a batch of one, the kernel's normal form indexes the unit axis by 0 (``bf16_gemm.match_row_gemm``)."""
    import numpy as np

    import tvm_ascendfuse as af
    from tests.helpers import round_to_bf16, run_vm
    from tvm_ascendfuse.schedule.hostvec import has_bf16_dot
    from tvm_ascendfuse.target import get_target

    monkeypatch.setenv("ASCENDFUSE_BF16_DOT", "on")     # also where the default does not choose it
    if not has_bf16_dot(get_target("ascend910b").host_target()):
        pytest.skip("the host has no AVX512-BF16")
    m, k, n = 64, 256, 192
    mod, w, b = _proj_add_ln_model(m, k, n, lead=lead)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((*lead, m, k)).astype("float32")
    r = rng.standard_normal((*lead, m, n)).astype("float32")
    res = af.compile_model(mod, precision_mode="force_bf16")
    rows, notes = _gemm_norm_notes(res)
    assert rows and any("bf16 dot product" in s for s in notes), notes
    got = run_vm(res.executable, [x, r])

    def ln(h):
        mu = h.mean(-1, keepdims=True)
        return (h - mu) / np.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5)

    want = ln(round_to_bf16(x).astype(np.float64) @ round_to_bf16(w).astype(np.float64) + b + r)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    exact = ln(x.astype(np.float64) @ w + b + r)
    cos = float(got.ravel() @ exact.ravel() / np.linalg.norm(got) / np.linalg.norm(exact))
    assert cos >= 0.999
    rows, notes = _gemm_norm_notes(af.compile_model(mod))
    assert rows and not any("bf16" in s for s in notes)


def test_bf16_build_runs_swiglu_products_on_the_dot_product(monkeypatch):
    """A force_bf16 SwiGLU kernel, silu(x Wg) * (x Wu): both products on the bf16 dot product, the numbers of
    the bf16-rounded operands with float32 sums; a float32 build keeps float32 FMAs."""
    import numpy as np

    import tvm_ascendfuse as af
    from tests.helpers import round_to_bf16, run_vm
    from tvm_ascendfuse.schedule.hostvec import has_bf16_dot
    from tvm_ascendfuse.target import get_target

    monkeypatch.setenv("ASCENDFUSE_BF16_DOT", "on")     # also where the default does not choose it
    if not has_bf16_dot(get_target("ascend910b").host_target()):
        pytest.skip("the host has no AVX512-BF16")
    m, k, n = 64, 128, 96
    rng = np.random.default_rng(0)
    wg, wu = ((rng.standard_normal((k, n)) / np.sqrt(k)).astype("float32") for _ in range(2))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.multiply(op.nn.silu(op.matmul(x, relax.const(wg))), op.matmul(x, relax.const(wu))))
        bb.emit_func_output(out)
    mod = bb.get()

    def notes_of(res):
        rows = [r for r in res.report.kernels if r.get("rule") == "multi-matmul"]
        notes = res.report.sections.get("schedule_notes", {})
        return rows, [s for r in rows for s in notes.get(r["name"], [])]

    res = af.compile_model(mod, precision_mode="force_bf16")
    rows, notes = notes_of(res)
    assert rows and sum(s.count("bf16 dot product") for s in notes) == 2, notes
    xv = rng.standard_normal((m, k)).astype("float32")
    got = run_vm(res.executable, [xv])
    xb = round_to_bf16(xv).astype(np.float64)
    g, u = xb @ round_to_bf16(wg).astype(np.float64), xb @ round_to_bf16(wu).astype(np.float64)
    want = g / (1 + np.exp(-g)) * u
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    rows, notes = notes_of(af.compile_model(mod))
    assert rows and not any("bf16" in s for s in notes)
