"""MatmulRule: numbers equal to the unscheduled kernel on odd, symbolic, fp16, batched, transposed and
LayerNorm-prologue GEMMs; UB use within both presets; weight prepacking exact through the Relax passes."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.relax import op

from tests.helpers import assert_close, tol
from tests.schedule.kernels import HOST, NATIVE, check_rule, fused_kernel, schedule_gemms
from tvm_ascendfuse.analysis.ub_usage import kernel_usage
from tvm_ascendfuse.schedule.analysis import find_gemm
from tvm_ascendfuse.schedule.hostvec import HostVector, host_vector
from tvm_ascendfuse.schedule.matmul import MatmulRule, choose_tiles
from tvm_ascendfuse.target import get_target


def linear_relu(x, w, b):
    return op.nn.relu(op.add(op.matmul(x, w), b))


@pytest.mark.parametrize("host", [HOST, NATIVE], ids=["portable", "native"])
@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (37, 70, 45), (5, 8, 6), (1, 40, 24)])
def test_linear_bias_relu_odd_sizes(m, k, n, host):
    mod = check_rule(MatmulRule(), fused_kernel(linear_relu, [(m, k), (k, n), (n,)]), host=host)
    assert "local.UB" in mod.script()


def test_batched_3d_by_2d_with_gelu_epilogue():
    def build(x, w, b):
        return op.nn.gelu(op.add(op.matmul(x, w), b))

    mod = check_rule(MatmulRule(), fused_kernel(build, [(2, 13, 24), (24, 40), (40,)]), host=NATIVE)
    assert "T.erf(" not in mod.script()         # erf became the vectorisable polynomial


def test_batched_matmul_without_epilogue():
    check_rule(MatmulRule(), fused_kernel(lambda a, b: op.matmul(a, b), [(3, 20, 24), (3, 24, 17)]), host=NATIVE)


def test_transposed_weight_inside_the_kernel():
    def build(x, w, b, r):
        return op.add(op.nn.relu(op.add(op.matmul(x, op.permute_dims(w)), b)), r)   # + residual

    check_rule(MatmulRule(), fused_kernel(build, [(19, 32), (48, 32), (48,), (19, 48)]), host=NATIVE)


def test_layernorm_prologue():
    def build(x, g, b, w, bias):
        return op.nn.gelu(op.add(op.matmul(op.nn.layer_norm(x, g, b, axes=[-1]), w), bias))

    check_rule(MatmulRule(), fused_kernel(build, [(1, 20, 48), (48,), (48,), (48, 64), (64,)]), host=NATIVE)


@pytest.mark.parametrize("rows", [1, 13, 32])
def test_symbolic_sequence_length(rows):
    n = tirx.Var("n", "int64")
    func = fused_kernel(linear_relu, [(1, n, 40), (40, 48), (48,)])
    check_rule(MatmulRule(), func, host=NATIVE, sizes={"n": rows})


def test_float16():
    check_rule(MatmulRule(), fused_kernel(linear_relu, [(21, 24), (24, 40), (40,)], dtype="float16"), host=NATIVE)


def test_declines_non_gemm_kernels():
    add = fused_kernel(lambda a, b: op.nn.relu(op.add(a, b)), [(8, 16), (8, 16)])
    conv = fused_kernel(lambda x, w: op.nn.conv2d(x, w), [(1, 4, 8, 8), (8, 4, 3, 3)])
    norm = fused_kernel(lambda x: op.sum(x, axis=[1]), [(8, 16)])
    for func in (add, conv, norm):
        assert MatmulRule().apply(func, get_target("ascend910b"), HOST) is None


def test_recognises_roles_not_names():
    """W enters as (N, K) through a transpose inside the kernel: after inlining, the rule finds N and K
    on the parameter's axes and packs it, whatever the kernel is called."""
    func = fused_kernel(lambda x, w: op.matmul(x, op.permute_dims(w)), [(6, 10), (32, 10)])
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    _, _, info = find_gemm(sch)
    assert (len(info.m), info.b_n_axis, info.b_k_axis) == (1, 1, 0)     # the transpose's output is (K, N)
    func = func.with_attr("global_symbol", "some_unrelated_name").with_attr("layout_free_buffers", [1])
    mod = check_rule(MatmulRule(), func, host=NATIVE)
    assert "layout_rewrite_preproc" in mod.script() and "T_transpose" not in mod.script()


@pytest.mark.parametrize("preset", ["ascend910b", "ascend310p"])
@pytest.mark.parametrize("shape", [(64, 256, 128), (37, 70, 45), (128, 768, 96)])
def test_on_chip_bytes_within_capacity(preset, shape):
    m, k, n = shape
    target = get_target(preset)
    func = fused_kernel(linear_relu, [(m, k), (k, n), (n,)])
    for stage_a in (False, True):
        sch = MatmulRule(stage_a=stage_a).apply(func, target, NATIVE)
        usage = kernel_usage("k", sch.mod["main"], target)
        ub = usage.bytes("local.UB")
        assert 0 < ub <= target.capacity("local.UB"), (preset, shape, ub)
        assert not usage.symbolic("local.UB")
        for scope in ("local.L1", "local.L0A", "local.L0B", "local.L0C"):
            assert usage.bytes(scope) <= target.capacity(scope)


def test_staged_a_panel_is_exact_and_split_by_ub():
    target = get_target("ascend910b")
    func = fused_kernel(linear_relu, [(16, 2400), (2400, 32), (32,)])
    mod = check_rule(MatmulRule(stage_a=True), func, host=NATIVE, target=target)
    usage = kernel_usage("k", mod["main"], target)
    assert usage.bytes("local.UB") <= target.ub_usable
    assert len([a for a in usage.allocations if a.scope == "local.UB"]) == 2   # accumulator + A panel


def test_tiles_follow_host_vector_width():
    npu = get_target("ascend910b")
    avx512 = choose_tiles(64, 1024, 1024, "float32", HostVector(512, 32, 2), npu)
    sse = choose_tiles(64, 1024, 1024, "float32", HostVector(128, 16, 2), npu)
    assert (avx512.vl, avx512.mr * avx512.nvec) == (16, 16)
    assert (sse.vl, sse.mr * sse.nvec) == (4, 8)
    assert host_vector(NATIVE).bits >= host_vector(HOST).bits


def test_vector_lanes_are_the_targets_not_this_machines():
    """Every rule sizes its vectors for the target's CPU: an AVX2 or a portable (SSE) build compiled on an
    AVX-512 machine gets 8 or 4 fp32 lanes (LLVM's own vector-width query answers for the compiling machine)."""
    from tvm_ascendfuse.schedule.common import vector_bits, vector_lanes

    def target(mcpu=None):
        return tvm.target.Target({"kind": "llvm", "num-cores": 2, **({"mcpu": mcpu} if mcpu else {})})

    assert (vector_lanes(target("haswell"), 32), vector_lanes(target(), 32)) == (8, 4)
    assert vector_lanes(target("haswell"), 16) == 16 and vector_lanes(target("skylake-avx512"), 32) == 16
    for t in (target("haswell"), target(), target("skylake-avx512"), NATIVE):
        assert vector_bits(t) == host_vector(t).bits


# ---- weight prepacking through the Relax passes -----------------------------------------------------

def _relax_linear(w, b, m=16):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, w.shape[0]), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.nn.relu(op.add(op.matmul(x, relax.const(w)), relax.const(b))))
        bb.emit_func_output(out)
    return bb.get()


def _build(mod, prepack_passes=True):
    passes = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
              relax.transform.FuseTIR()]
    if prepack_passes:
        passes.append(relax.transform.AttachAttrLayoutFreeBuffers())
    passes.append(schedule_gemms)
    if prepack_passes:
        passes += [relax.transform.SplitLayoutRewritePreproc(), relax.transform.FoldConstant(),
                   relax.transform.DeadCodeElimination()]
    return tvm.transform.Sequential(passes)(mod)


def test_constant_weight_is_packed_once_at_compile_time():
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((40, 64)).astype("float32"), rng.standard_normal(64).astype("float32")
    lowered = _build(_relax_linear(w, b))
    names = [gv.name_hint for gv, f in lowered.functions.items() if isinstance(f, tirx.PrimFunc)]
    assert any(n.endswith("_prepacked") for n in names)
    assert not any(n.endswith("_weight_prepack") for n in names)     # folded away by FoldConstant
    kernel = next(f for gv, f in lowered.functions.items() if gv.name_hint.endswith("_prepacked"))
    assert len(kernel.params[1].ty.shape) == 3                          # (N/nr, K, nr)
    x = rng.standard_normal((16, 40)).astype("float32")
    ex = tvm.compile(lowered, target=NATIVE)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert_close(out, np.maximum(x @ w + b, 0), **tol("float32"))


def test_weight_computed_at_run_time_is_not_packed():
    func = fused_kernel(linear_relu, [(16, 40), (40, 64), (64,)])          # no layout_free_buffers attr
    sch = MatmulRule().apply(func, get_target("ascend910b"), NATIVE)
    assert "layout_rewrite_preproc" not in sch.mod.script()
    packed = MatmulRule().apply(func.with_attr("layout_free_buffers", [1]), get_target("ascend910b"), NATIVE)
    assert "layout_rewrite_preproc" in packed.mod.script()
    # the packing block inside the kernel is exact even without the Relax passes that lift it out
    check_rule(MatmulRule(), func.with_attr("layout_free_buffers", [1]), host=NATIVE)


def test_prepack_pass_folds_packing_and_leaves_other_modules_alone():
    from tvm_ascendfuse.schedule.prepack import PrepackConstantWeights, has_prepack_blocks

    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((24, 32)).astype("float32"), rng.standard_normal(32).astype("float32")
    passes = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
              relax.transform.FuseTIR(), relax.transform.AttachAttrLayoutFreeBuffers()]
    fused = tvm.transform.Sequential(passes)(_relax_linear(w, b, m=8))
    assert not has_prepack_blocks(fused)
    assert PrepackConstantWeights()(fused).same_as(fused)
    scheduled = schedule_gemms(fused)
    assert has_prepack_blocks(scheduled)
    out = PrepackConstantWeights()(scheduled)
    names = [gv.name_hint for gv, f in out.functions.items() if isinstance(f, tirx.PrimFunc)]
    assert names and all(n.endswith("_prepacked") for n in names)
    x = rng.standard_normal((8, 24)).astype("float32")
    res = relax.VirtualMachine(tvm.compile(out, target=NATIVE), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert_close(res, np.maximum(x @ w + b, 0), **tol("float32"))


def test_epilogue_with_head_split_layout_change():
    """Projection + bias + reshape/transpose into heads in one kernel: exact, and the UB tile stays small."""
    def build(x, w, b):
        return op.permute_dims(op.reshape(op.add(op.matmul(x, w), b), (1, 16, 4, 16)), [0, 2, 1, 3])

    target = get_target("ascend310p")
    mod = check_rule(MatmulRule(), fused_kernel(build, [(1, 16, 32), (32, 64), (64,)]), host=NATIVE, target=target)
    assert kernel_usage("k", mod["main"], target).bytes("local.UB") <= 16 * 64 * 4 // 2


@pytest.mark.parametrize("rows", [100, 1500])
def test_layernorm_prologue_head_split_epilogue_ub_as_planned(rows):
    """LayerNorm -> linear + bias -> reshape into heads (Whisper's query projection): the UB the schedule
    allocates is at most what the rule's capacity check planned (one register block). The head split's
    index ``((h * 64 + d) // n + i) % rows`` once made the accumulator rows x nr in UB (192512 B at 1500
    rows against 188416 usable; the kernel fell to the fallback rule)."""
    from tvm_ascendfuse.schedule.matmul import planned_ub_bytes

    k, n = 32, 128

    def build(x, g, b, w, bias):
        return op.reshape(op.add(op.matmul(op.nn.layer_norm(x, g, b, [-1]), w), bias), (1, rows, n // 64, 64))

    target = get_target("ascend910b")
    func = fused_kernel(build, [(1, rows, k), (k,), (k,), (k, n), (n,)])
    mod = check_rule(MatmulRule(), func, host=NATIVE, target=target) if rows < 1000 else \
        MatmulRule().apply(func, target, NATIVE).mod
    tiles = choose_tiles(rows, n, k, "float32", host_vector(NATIVE), target)
    assert kernel_usage("k", mod["main"], target).bytes("local.UB") <= planned_ub_bytes(tiles, "float32", target,
                                                                                       False)


@pytest.mark.parametrize("host", [HOST, NATIVE], ids=["portable", "native"])
@pytest.mark.parametrize("rows,k,heads,d", [(13, 16, 4, 20), (196, 128, 8, 80)])
def test_head_split_epilogue_cutting_column_tiles(rows, k, heads, d, host):
    """GEMM -> reshape -> per-column scale and shift -> reshape into heads of ``d`` columns (LeViT's
    attention projection, 640 = 8 x 80). A tile of columns that crosses a head is no box of the epilogue's
    (head, column) iterations: TVM's region analysis gave the epilogue part of a head per tile, which read
    columns the tile had not computed (max abs 1.7 on LeViT). Such an epilogue runs after the GEMM."""
    n = heads * d

    def build(x, w, s, t):
        y = op.reshape(op.matmul(x, w), (rows, n))
        return op.reshape(op.add(op.multiply(y, s), t), (1, rows, heads, d))

    check_rule(MatmulRule(), fused_kernel(build, [(1, rows, k), (k, n), (1, n), (1, n)]), host=host)


@pytest.mark.parametrize("host", [HOST, NATIVE], ids=["portable", "native"])
def test_plane_rows_padded_in_the_tile_do_not_reach_the_next_row(host):
    """NCHW -> NHWC -> LayerNorm -> QKV projection + bias -> split into q/k/v heads (GCViT's window attention
    on a 14 x 14 plane): the GEMM's rows are the plane's 14 columns, padded to 16 in the accumulator, and the
    epilogue reads them flattened (``acc[p // 14, p % 14]``). Under an 8-row register block TVM bounded the
    epilogue of a row's last block by 8 pixels, two of them the next row's, computed by another task: a race
    (gcvit_xxtiny 1.4e-2 of the output's scale off ORT on some runs). The epilogue may run per tile only
    where each of its iterations runs once."""
    from tvm.s_tir import Schedule

    from tvm_ascendfuse.schedule.row_blocks import runs_each_point_once

    c, heads, d = 64, 2, 32

    def build(x, g, b, w, bias):
        t = op.nn.layer_norm(op.permute_dims(x, [0, 2, 3, 1]), g, b, axes=[-1])
        qkv = op.reshape(op.add(op.matmul(t, w), bias), (1, 196, 3, heads, d))
        return op.permute_dims(qkv, [2, 0, 3, 1, 4])

    mod = check_rule(MatmulRule(), fused_kernel(build, [(1, c, 14, 14), (c,), (c,), (c, 3 * heads * d),
                                                        (3 * heads * d,)]), host=host)
    sch = Schedule(mod)
    out = mod["main"].params[-1]
    writers = [sch.get_sblock(name) for name in _block_names(mod["main"]) if _writes(mod["main"], name, out)]
    assert writers and all(runs_each_point_once(sch, b) is not False for b in writers)


def _block_names(func) -> list:
    import tvm_ffi
    from tvm import s_tir

    names = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlockRealize, lambda r: names.append(r.block.name_hint)))
    return [n for n in names if n != "root"]


def _writes(func, name, buf) -> bool:
    import tvm_ffi
    from tvm import s_tir

    found = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlockRealize, lambda r: found.append(
        r.block.name_hint == name and any(w.source.same_as(buf) for w in r.block.writes))))
    return any(found)


def test_epilogue_selecting_by_index_is_not_placed_per_tile():
    """concat -> slice after the GEMM (fuzz seed 539): the slice reads the tile in one branch of an index
    condition, so it must run after the GEMM; per tile it read uninitialised memory."""
    from tvm.relax import op as rop

    def build(x, w, other):
        cat = rop.concat([other, rop.matmul(x, w)], axis=1)
        return rop.strided_slice(cat, axes=[1], begin=[3], end=[10])   # straddles both parts

    check_rule(MatmulRule(), fused_kernel(build, [(8, 7), (7, 7), (8, 7)]), host=NATIVE)


# ---- A through a layout-changing producer (attention's head merge) ------------------------------------

def head_merge_linear(heads, seq, d, batch=1):
    """[b, heads, seq, d] -> permute(0, 2, 1, 3) -> reshape [b, seq, heads * d] -> @ W + bias + residual."""
    def build(a, w, b, r):
        x = op.reshape(op.permute_dims(a, [0, 2, 1, 3]), (batch, seq, heads * d))
        return op.add(op.add(op.matmul(x, w), b), r)

    return build


@pytest.mark.parametrize("heads,seq,d,n,dtype", [
    (4, 37, 16, 48, "float32"),        # odd seq: M padded; N not a multiple of the register block
    (16, 37, 64, 32, "float32"),       # K = 1024
    (16, 150, 64, 32, "float32"),      # 150 rows of K = 1024 exceed one L1 panel: groups of row blocks
    (2, 8, 8, 64, "float32"),          # M = one register block, no padding
    (4, 21, 16, 40, "float16"),
])
def test_head_merge_producer_of_a_is_staged_on_chip(heads, seq, d, n, dtype):
    """Inlined, the head merge leaves A indexed by k // d and k % d, which is no GEMM; the rule instead
    computes A's producer into a packed panel of whole rows in L1, once per group of row blocks. Exact,
    within UB and L1, and A never goes back to GM."""
    target = get_target("ascend910b")
    shapes = [(1, heads, seq, d), (heads * d, n), (n,), (1, seq, n)]
    func = fused_kernel(head_merge_linear(heads, seq, d), shapes, dtype=dtype)
    mod = check_rule(MatmulRule(), func, host=NATIVE, target=target)
    usage = kernel_usage("k", mod["main"], target)
    assert usage.bytes("local.UB") <= target.ub_usable
    assert usage.bytes("local.L1") <= target.capacity("local.L1") // 2                   # double-buffered
    assert sorted(a.scope for a in usage.allocations) == ["local.L1", "local.UB"]  # A panel + accumulator
    assert "T.parallel" in mod.script()


def test_head_merge_with_batch():
    shapes = [(3, 4, 13, 16), (64, 32), (32,), (3, 13, 32)]
    check_rule(MatmulRule(), fused_kernel(head_merge_linear(4, 13, 16, batch=3), shapes), host=NATIVE)


def test_head_merge_with_symbolic_sequence_stages_per_register_block():
    """A symbolic M has no static L1 panel: A's producer goes per register block and K chunk into a UB panel
    of constant size (the accumulator of a symbolic M stays in memory, as for any symbolic-M GEMM)."""
    n = tirx.Var("n", "int64")
    target = get_target("ascend910b")

    def build(a, w, b):
        return op.add(op.matmul(op.reshape(op.permute_dims(a, [0, 2, 1, 3]), (1, n, 1024)), w), b)

    func = fused_kernel(build, [(1, 16, n, 64), (1024, 32), (32,)])
    for rows in (5, 19):
        mod = check_rule(MatmulRule(), func, host=NATIVE, target=target, sizes={"n": rows})
    usage = kernel_usage("k", mod["main"], target)
    assert [a.scope for a in usage.allocations if a.scope != "global"] == ["local.UB"]   # the A panel
    assert all(a.nbytes is not None for a in usage.allocations if a.scope == "local.UB")
    assert usage.bytes("local.UB") <= target.ub_usable


@pytest.mark.parametrize("preset", ["ascend910b", "ascend310p"])
@pytest.mark.parametrize("seq", [256, 37])
def test_head_merge_kernel_gets_the_matmul_rule_and_passes_ub_verification(preset, seq):
    """W7's output projection shape (16 heads x 64, N 1024) through the schedule and verification phases."""
    from tvm_ascendfuse.analysis.verify_ub import VerifyUBCapacity
    from tvm_ascendfuse.report import FusionReport
    from tvm_ascendfuse.schedule.apply import ApplyUBSchedules

    func = fused_kernel(head_merge_linear(16, seq, 64), [(1, 16, seq, 64), (1024, 1024), (1024,), (1, seq, 1024)])
    report = FusionReport()
    report.set_kernels([{"name": "fused_head_merge_linear", "launches": 1}])
    target = get_target(preset)
    mod = ApplyUBSchedules(target, report, NATIVE)(
        tvm.IRModule({tvm.ir.GlobalVar("fused_head_merge_linear"): func.with_attr("global_symbol", "k")}))
    assert report.sections["schedules"] == {"fused_head_merge_linear": "matmul"}
    assert report.kernels[0]["rule"] == "matmul"
    VerifyUBCapacity(target, report)(mod)
    scopes = report.sections["ub_usage"]["fused_head_merge_linear"]["scopes"]
    assert set(scopes) == {"local.UB", "local.L1"}


def test_plain_transposed_a_is_still_inlined_not_staged():
    """A transpose that inlines to plain indices (A = Xᵀ) keeps reading the parameter: no staging copy."""
    func = fused_kernel(lambda x, w: op.matmul(op.permute_dims(x), w), [(24, 19), (24, 32)])
    mod = check_rule(MatmulRule(), func, host=NATIVE)
    assert len([a for a in kernel_usage("k", mod["main"], get_target("ascend910b")).allocations
                if a.scope == "local.UB"]) == 1


@pytest.mark.parametrize("heads,seq,d", [(2, 37, 16), (6, 20, 64)])
def test_head_split_producer_of_b_is_staged(heads, seq, d):
    """P.V with V sliced from a packed Q|K|V projection and split into heads (Whisper's encoder): inlined,
    B is indexed through the slice and the head split, which is no GEMM; the rule writes B's producer once
    in front of the GEMM instead of giving the kernel up to the fallback. Exact vs the unscheduled kernel."""
    def build(p, qkv):
        v = op.strided_slice(qkv, axes=[2], begin=[2 * heads * d], end=[3 * heads * d])
        return op.matmul(p, op.permute_dims(op.reshape(v, (1, seq, heads, d)), [0, 2, 1, 3]))

    func = fused_kernel(build, [(1, heads, seq, seq), (1, seq, 3 * heads * d)])
    for host in (HOST, NATIVE):
        mod = check_rule(MatmulRule(), func, host=host)
    assert "T.parallel" in mod.script()


def test_gemm_output_returned_and_rotated_in_the_same_kernel():
    """LLaMA's K|V projection: the GEMM result is a kernel output (V is read by another kernel) and its K
    part is rotated (RoPE, rotate-half: reads the other half of each head) in the same kernel. The output
    cannot move to UB; the rule stages the tile and copies it out instead of raising."""
    s, kv, d = 24, 2, 8

    def build(x, w, cos, sin):
        mm = op.matmul(x, w)
        k = op.permute_dims(op.reshape(op.strided_slice(mm, axes=[2], begin=[0], end=[kv * d]), (1, s, kv, d)),
                            [0, 2, 1, 3])
        rot = op.concat([op.negative(op.strided_slice(k, axes=[3], begin=[d // 2], end=[d])),
                         op.strided_slice(k, axes=[3], begin=[0], end=[d // 2])], axis=3)
        return relax.Tuple([mm, op.add(op.multiply(k, cos), op.multiply(rot, sin))])

    func = fused_kernel(build, [(1, s, 32), (32, 2 * kv * d), (1, 1, s, d), (1, 1, s, d)])
    for host in (HOST, NATIVE):
        check_rule(MatmulRule(), func, host=host)


def test_gemm_chain_is_declined_but_attention_is_taken():
    """Two products with only elementwise work between them are a GEMM chain (LayerNorm -> linear -> GELU ->
    linear, ConvNeXt's block): the rule declines it, since its product-as-prologue schedule takes LLVM tens of
    seconds. Two products with a softmax between them stay the rule's when the attention rule declines them."""
    def mlp(x, g, b, w1, w2):
        h = op.nn.layer_norm(x, g, b, axes=[-1])
        return op.matmul(op.nn.gelu(op.matmul(h, w1)), w2)

    check_rule(MatmulRule(), fused_kernel(mlp, [(49, 32), (32,), (32,), (32, 64), (64, 32)]), expect=False)

    def attention(q, k, v):
        return op.matmul(op.nn.softmax(op.matmul(q, op.permute_dims(k, [0, 2, 1])), axis=-1), v)

    check_rule(MatmulRule(), fused_kernel(attention, [(2, 7, 8), (2, 7, 8), (2, 7, 8)]))


def test_narrow_product_takes_rows_dividing_m_instead_of_padding_a():
    """P.V over keys the register block's 8 rows do not divide (375 here, Whisper: 1500) with 64 output
    columns and a P bigger than L1: P is not copied into an M-padded buffer (54 MB per call on Whisper);
    the register block takes 5 rows, which divide M. Exact vs the unscheduled kernel. A small A still gets
    its M tail padded (``test_tunable``: 12 rows)."""
    heads, d, seq = 1, 64, 375

    def build(p, qkv):
        v = op.strided_slice(qkv, axes=[2], begin=[2 * heads * d], end=[3 * heads * d])
        return op.matmul(p, op.permute_dims(op.reshape(v, (1, seq, heads, d)), [0, 2, 1, 3]))

    mod = check_rule(MatmulRule(), fused_kernel(build, [(1, heads, seq, seq), (1, seq, 3 * heads * d)]), host=NATIVE)
    shapes = [tuple(int(x) for x in b.shape) for b in mod["main"].body.block.alloc_buffers]
    assert not any(len(s) == 4 and s[1] == heads and s[2] > seq for s in shapes), shapes
    npu = get_target("ascend910b")
    assert choose_tiles(seq, d, seq, "float32", HostVector(512, 32, 2), npu).mr == 5
    assert choose_tiles(60, d, 60, "float32", HostVector(512, 32, 2), npu).mr == 8
