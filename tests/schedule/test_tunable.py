"""The tunable Matmul space: the default is in it, every point fits UB and computes the kernel exactly, and a
sampled decision replays to the same schedule (what a database record does)."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import s_tir

from tvm_ascendfuse.analysis.verify_ub import VerifyUBCapacity
from tvm_ascendfuse.errors import AscendFuseError
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.schedule.hostvec import HostVector
from tvm_ascendfuse.schedule.matmul import MatmulRule, choose_tiles, fits_ub, tile_candidates
from tvm_ascendfuse.schedule.tunable import (
    FixedTiles,
    LeastDrawnTiles,
    apply_tunable,
    candidate_schedules,
    space_generator,
    ub_fits,
)
from tvm_ascendfuse.target import get_target, make_target
from tvm_ascendfuse.tune import build_candidate, extract_kernels
from tvm_ascendfuse.workloads import mlp3
from tests.helpers import assert_close

NPU = get_target("ascend910b")
HOST = NPU.host_target(portable=True)


@pytest.fixture(scope="module")
def kernel():
    """The one kernel of Linear(40->40)+bias+ReLU on 12 rows: tails of M and N exercise padding."""
    (k,) = extract_kernels(import_onnx(mlp3(rows=12, width=40, depth=1)), NPU, HOST)
    assert k.rule == "matmul" and k.tunable
    return k


@pytest.fixture(scope="module")
def points(kernel):
    return candidate_schedules(kernel.workload, "matmul", NPU, HOST)


def test_space_holds_the_default_first(kernel, points):
    default = MatmulRule().apply(kernel.workload["main"], NPU, HOST)
    assert tvm_ffi.structural_equal(points[0][1].mod, default.mod)
    tiles = [t for t, _ in points]
    assert len(points) >= 4 and len(set(tiles)) == len(tiles)
    assert len({tvm_ffi.structural_hash(s.mod) for _, s in points}) == len(points)   # distinct schedules


def _run(mod, inputs):
    mod = tvm.IRModule({"main": mod["main"].with_attr("global_symbol", "main")})
    args = [tvm.runtime.tensor(x) for x in inputs]
    tvm.compile(mod, target=HOST)["main"](*args)
    return args[-1].numpy()


def test_every_point_fits_ub_and_matches_the_unscheduled_kernel(kernel, points):
    func = kernel.workload["main"]
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in func.params]
    expected = _run(kernel.workload, inputs)
    for tiles, sch in points:
        assert ub_fits(sch.mod["main"], NPU), tiles
        VerifyUBCapacity(NPU)(sch.mod)                          # raises UBCapacityError on overflow
        assert "local.UB" in sch.mod.script()
        assert_close(_run(sch.mod, inputs), expected, rtol=1e-5, atol=1e-5, err_msg=str(tiles))


def test_candidates_respect_the_ub_of_the_target():
    hv = HostVector(512, 32, 2)                                   # AVX-512: 16 accumulator registers
    big = tile_candidates(256, 1024, 1024, "float32", hv, NPU)
    tiny = make_target("ascend910b", ub_bytes=2048, ub_reserved_bytes=0)
    small = tile_candidates(256, 1024, 1024, "float32", hv, tiny)
    assert big[0] == choose_tiles(256, 1024, 1024, "float32", hv, NPU)
    assert (small[0].mr, small[0].nr) == (big[0].mr, big[0].nr)     # the default block, its K chunk shorter
    assert all(fits_ub(t, "float32", NPU) for t in big) and all(fits_ub(t, "float32", tiny) for t in small[1:])
    assert all(t.mr * t.nvec <= hv.accumulators for t in big[1:])
    assert 1 < len(small) < len(big)
    assert not fits_ub(max(big, key=lambda t: t.mr * t.nr + t.nr), "float32", tiny)


def test_sampled_decision_is_in_the_trace_and_replays(kernel, points):
    chooser = LeastDrawnTiles()
    chooser.allowed = {t for t, _ in points}
    drawn = []
    for seed in range(4):
        sch = s_tir.Schedule(kernel.workload, seed=seed + 1)
        apply_tunable(sch, "matmul", NPU, HOST, chooser)
        drawn.append(chooser.last)
        decisions = [d for inst, d in sch.trace.decisions.items() if inst.kind.name == "SampleCategorical"]
        assert len(decisions) == 1 and chooser.candidates[int(decisions[0])] == chooser.last
        replay = s_tir.Schedule(kernel.workload)
        sch.trace.apply_to_schedule(replay, remove_postproc=False)
        assert tvm_ffi.structural_equal(replay.mod, sch.mod)
    default = points[0][0]
    assert drawn[:2] == [default, default]                       # the default is measured first
    assert len(set(drawn[2:])) == 2 and default not in drawn[2:]  # then the least-drawn others


def test_measured_build_names_the_kernel_and_drops_the_packing_block(points):
    rt = build_candidate(points[0][1].mod, HOST)
    assert rt["main"] is not None


def test_space_generator_makes_a_metaschedule_space(kernel):
    from tvm.s_tir import meta_schedule as ms

    space = space_generator("matmul", NPU, HOST)
    assert isinstance(space, ms.space_generator.ScheduleFn)
    with pytest.raises(AscendFuseError, match="no tunable space"):
        apply_tunable(s_tir.Schedule(kernel.workload), "elementwise", NPU, HOST, LeastDrawnTiles())


def test_ub_postproc_rejects_a_schedule_over_capacity(points):
    from tvm_ascendfuse.schedule.tunable import ub_check_postproc

    sch = points[0][1]
    assert ub_check_postproc(NPU).apply(sch) is True
    tiny = make_target("ascend910b", ub_bytes=64, ub_reserved_bytes=0)
    assert ub_check_postproc(tiny).apply(sch) is False


def _lying_rule(monkeypatch):
    """The Matmul rule with a wrong capacity check: its candidates are computed for the real UB while the
    kernel is scheduled for a 100-byte one (it stages 32-128 bytes per candidate, so some do not fit)."""
    import tvm_ascendfuse.schedule.matmul as matmul

    real = matmul.tile_candidates
    monkeypatch.setattr(matmul, "tile_candidates", lambda m, n, k, dtype, hv, target: real(m, n, k, dtype, hv, NPU))
    return make_target("ascend910b", ub_bytes=100, ub_reserved_bytes=0)


def _fit_by_tiles(workload, target):
    first = FixedTiles(0)
    apply_tunable(s_tir.Schedule(workload), "matmul", target, HOST, first)
    fit = {}
    for i, tiles in enumerate(first.candidates):
        try:
            sch = apply_tunable(s_tir.Schedule(workload), "matmul", target, HOST, FixedTiles(i))
        except AscendFuseError:
            continue
        fit[tiles] = ub_fits(sch.mod["main"], target)
    return fit


def test_the_space_leaves_out_points_over_capacity(kernel, monkeypatch):
    tiny = _lying_rule(monkeypatch)
    fit = _fit_by_tiles(kernel.workload, tiny)
    assert sum(fit.values()) >= 3 and not all(fit.values())     # the lie lets tiles over capacity through
    kept = [t for t, _ in candidate_schedules(kernel.workload, "matmul", tiny, HOST)]
    assert set(kept[1:]) == {t for t, ok in fit.items() if ok} - {kept[0]}   # the default is always point 0


def test_the_search_never_returns_a_candidate_over_capacity(kernel, monkeypatch):
    """The postprocessor re-counts every candidate the search draws: with the space's own filter bypassed
    (every tile allowed) and the rule's check wrong, no candidate it hands to the measurer fails UB
    verification, though the draws included tiles over capacity."""
    from tvm.s_tir import meta_schedule as ms

    from tvm_ascendfuse.tune.search import tune_context

    tiny = _lying_rule(monkeypatch)
    fit = _fit_by_tiles(kernel.workload, tiny)
    chooser = LeastDrawnTiles()
    chooser.allowed = set(fit)
    ctx = tune_context(kernel.workload, HOST, space_generator("matmul", tiny, HOST, chooser), "t", 1, 1)
    n = len(fit)
    ctx.pre_tuning(max_trials=n, num_trials_per_iter=n, design_spaces=ctx.generate_design_space(),
                   database=ms.database.MemoryDatabase())
    candidates = list(ctx.generate_measure_candidates())
    ctx.post_tuning()
    assert len(candidates) >= 3
    for c in candidates:
        assert ub_fits(c.sch.mod["main"], tiny)
        VerifyUBCapacity(tiny)(c.sch.mod)                       # raises UBCapacityError on overflow
    assert any(not fit[t] for t in chooser.drawn), "no draw was over capacity: the test shows nothing"


def test_m_tail_with_a_constant_weight_keeps_the_matmul_rule(kernel, points):
    # 12 rows, 8-row blocks, constant weight: the rule pads M and packs the weight (it used to decline and
    # leave the GEMM to the fallback, measured 330x slower on 100x768x768); numbers: the test above
    default = points[0][1].mod.script()
    assert kernel.rule == "matmul" and points[0][0].mr == 8
    assert "meta_schedule.layout_rewrite_preproc" in default and "padded" in default
