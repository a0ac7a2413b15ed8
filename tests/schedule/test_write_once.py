"""The schedule phase's write-once check (``schedule/write_once.py``): a rule's schedule in which a block writing
an output runs some point of its domain twice, or writes an output element from two points, is refused with a
reason in the report and the kernel takes the next rule; blocks marked as overlapping on purpose (the depthwise
conv's channel overlap) are not refused."""

import numpy as np
import pytest
import tvm
from tvm import s_tir
from tvm.relax import op

from tests.helpers import assert_close
from tvm_ascendfuse.report import FusionReport
from tvm_ascendfuse.schedule import apply as ap
from tvm_ascendfuse.schedule import matmul as matmul_rule
from tvm_ascendfuse.schedule.common import ok
from tvm_ascendfuse.schedule.row_blocks import PointCounts, point_counts
from tvm_ascendfuse.schedule.write_once import OVERLAPPING_WRITES, elements_written_twice, output_races

from .kernels import HOST, NATIVE, NPU, fused_kernel
from .test_depthwise_conv import dw_kernel


def _gcvit_qkv():
    """NCHW -> NHWC -> LayerNorm -> QKV projection + bias -> q/k/v heads over a 14 x 14 plane (GCViT; see
    test_matmul.test_plane_rows_padded_in_the_tile_do_not_reach_the_next_row)."""
    c, heads, d = 64, 2, 32

    def build(x, g, b, w, bias):
        t = op.nn.layer_norm(op.permute_dims(x, [0, 2, 3, 1]), g, b, axes=[-1])
        qkv = op.reshape(op.add(op.matmul(t, w), bias), (1, 196, 3, heads, d))
        return op.permute_dims(qkv, [2, 0, 3, 1, 4])

    return fused_kernel(build, [(1, c, 14, 14), (c,), (c,), (c, 3 * heads * d), (3 * heads * d,)])


def _module(func):
    return tvm.IRModule({tvm.ir.GlobalVar("k"): func.with_attr("global_symbol", "k")})


def _run_matches(func, scheduled, host):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal([int(d) for d in p.ty.shape]).astype(str(p.ty.dtype)) for p in func.params]
    ref = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    ours = tvm.compile(tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), target=host)
    a = [tvm.runtime.tensor(x) for x in arrays]
    b = [tvm.runtime.tensor(x.copy()) for x in arrays]
    ref["main"](*a)
    ours["main"](*b)
    assert_close(b[-1].numpy(), a[-1].numpy(), rtol=1e-4, atol=1e-3)


@pytest.fixture
def unchecked_gemm_placement(monkeypatch):
    """The GEMM rule placing its epilogue per register block without its own each-point-once check: the
    placement that raced on GCViT."""
    monkeypatch.setattr(matmul_rule, "_placed_exactly",
                        lambda sch, block, loop, one_to_one: ok(sch.reverse_compute_at, block, loop))


def test_a_schedule_running_output_points_twice_is_refused_and_the_kernel_still_matches(unchecked_gemm_placement):
    func = _gcvit_qkv()
    report = FusionReport()
    mod = ap.ApplyUBSchedules(NPU, report, NATIVE)(_module(func))
    rules = report.sections["schedules"]
    assert rules["k"] not in ("matmul", "unscheduled"), rules
    [race] = report.sections["write_races_refused"]
    assert race["kernel"] == "k" and race["rule"] == "matmul" and race["final_rule"] == rules["k"]
    # 2 of the 14 pixels of each plane row ran in two tasks: 2 x 13 rows x 192 columns (the last row has none)
    assert race["points_run_twice"] == 2 * 13 * 192 and race["domain_points"] == 196 * 192
    assert race["points_missed"] == 0 and race["iterations_outside"] == 0
    [note] = [n for n in report.sections["schedule_notes"]["k"] if n.startswith("matmul: declined")]
    assert "kernel k" in note and race["block"] in note and "4992 of its 37632 points run more than once" in note
    _run_matches(func, mod["k"], NATIVE)


def test_the_gemm_rules_own_check_leaves_nothing_to_refuse():
    func = _gcvit_qkv()
    report = FusionReport()
    ap.ApplyUBSchedules(NPU, report, NATIVE)(_module(func))
    assert report.sections["schedules"]["k"] == "matmul"
    assert "write_races_refused" not in report.sections


def test_the_refusal_is_in_the_cli_summary(unchecked_gemm_placement):
    from tvm_ascendfuse.cli import summary_text

    report = FusionReport()
    ap.ApplyUBSchedules(NPU, report, NATIVE)(_module(_gcvit_qkv()))
    text = summary_text(report.to_dict())
    assert "runs some point twice" in text and "4992" in text


def _overlapped_depthwise():
    """A depthwise conv over 58 channels on 4-lane vectors (ShuffleNetV2's first stage): the last of its 15
    channel blocks overlaps the one before by two channels, whose 28 x 28 pixels it stores again."""
    return dw_kernel((1, 58, 28, 28), 3)


def test_the_channel_overlap_is_marked_and_not_refused():
    func = _overlapped_depthwise()
    report = FusionReport()
    mod = ap.ApplyUBSchedules(NPU, report, HOST)(_module(func))
    assert report.sections["schedules"]["k"] == "depthwise-conv2d"
    assert any("as overlapping full-vector blocks" in n for n in report.sections["schedule_notes"]["k"])
    assert "write_races_refused" not in report.sections
    sch = s_tir.Schedule(tvm.IRModule({"main": mod["k"]}))
    out = mod["k"].params[-1]
    [store] = [b for b in (sch.get(rv) for rv in _blocks(sch)) if any(w.source.same_as(out) for w in b.writes)]
    assert OVERLAPPING_WRITES in store.annotations
    assert elements_written_twice(store, out) == 2 * 28 * 28      # what the mark lets through
    _run_matches(func, mod["k"], HOST)


def test_an_unmarked_overlap_is_refused(monkeypatch):
    """The same kernel with the mark taken off its store: two channels written twice, the rule refused."""
    from tvm_ascendfuse.schedule import write_once

    monkeypatch.setattr(write_once, "OVERLAPPING_WRITES", "not.the.mark")
    report = FusionReport()
    ap.ApplyUBSchedules(NPU, report, HOST)(_module(_overlapped_depthwise()))
    [race] = report.sections["write_races_refused"]
    assert race["rule"] == "depthwise-conv2d" and race["elements_written_twice"] == 2 * 28 * 28
    assert report.sections["schedules"]["k"] != "depthwise-conv2d"


def _blocks(sch):
    from tvm_ascendfuse.schedule.write_once import _all_blocks

    return [rv for rv, _ in _all_blocks(sch)]


def test_point_counts_of_a_block_under_a_loop_it_does_not_use():
    """Each point run by every iteration of an outer loop its bindings do not use: all points twice."""
    f = fused_kernel(lambda x: op.nn.relu(x), [(4, 8)])
    sch = s_tir.Schedule(f)
    blk = sch.get_child_blocks(sch.get_sblock("root"))[0]
    assert point_counts(sch, blk).once
    i, j = sch.get_loops(blk)
    sch.split(i, [2, 2])            # 4 = 2 x 2: still once
    assert point_counts(sch, blk).once
    assert output_races(sch) == []


def test_point_counts_factor_independent_loop_groups():
    """A 14 x 14 plane flattened under 8-pixel tiles of its rows: the count over the grouped loops equals the
    count over the whole grid (the other loops only multiply it)."""
    f = fused_kernel(lambda x, w: op.reshape(op.matmul(x, w), (196, 24)), [(14, 14, 16), (16, 24)])
    sch = s_tir.Schedule(f)
    gemm, epi = sch.get_child_blocks(sch.get_sblock("root"))
    _, j, _, _ = sch.get_loops(gemm)
    jo, _ = sch.split(j, [None, 8])
    sch.reverse_compute_at(epi, jo)
    c = point_counts(sch, epi)
    # per plane row: pixels 14y+8 .. 14y+15 run in the second tile, 14(y+1)+0,1 twice (13 rows have a next;
    # the last row's tile is cut at pixel 196 by TVM's predicate)
    assert (c.domain, c.twice, c.missed, c.outside) == (196 * 24, 2 * 13 * 24, 0, 0)
    assert c == _whole_grid_counts(sch, epi)
    [race] = output_races(sch)
    assert race.counts == c


def _whole_grid_counts(sch, block):
    """``point_counts`` evaluated over the product of all the block's loops at once (no grouping)."""
    import math

    from tvm_ascendfuse.schedule.common import get_realize
    from tvm_ascendfuse.schedule.row_blocks import PointCounts, evaluate_index

    realize = get_realize(sch, block)
    fors = [sch.get(lp) for lp in sch.get_loops(block)]
    grids = np.meshgrid(*[np.arange(int(f.extent)) + int(f.min) for f in fors], indexing="ij")
    env = {f.loop_var.name: g.reshape(-1) for f, g in zip(fors, grids)}
    n = grids[0].size
    run = np.broadcast_to(np.asarray(evaluate_index(realize.predicate, env), dtype=bool), (n,))
    ivs = realize.block.iter_vars
    vals = [np.broadcast_to(np.asarray(evaluate_index(v, env)), (n,)) - int(iv.dom.min)
            for iv, v in zip(ivs, realize.iter_values)]
    dims = [int(iv.dom.extent) for iv in ivs]
    inside = run & np.all([(v >= 0) & (v < d) for v, d in zip(vals, dims)], axis=0)
    hits = np.bincount(np.ravel_multi_index([v[inside] for v in vals], dims), minlength=math.prod(dims))
    return PointCounts(domain=math.prod(dims), twice=int((hits > 1).sum()), missed=int((hits == 0).sum()),
                       outside=int(run.sum() - inside.sum()))


def test_an_intermediate_shared_by_the_tasks_and_written_twice_is_a_race():
    """The GCViT placement one block earlier: the flattening block per 8-pixel tile (reaching into the next
    plane row), its consumer left at the root. The flattened buffer is shared by all tiles (its accesses meet
    only at the root), and two tiles write the next row's first two pixels: one from an accumulator tile that
    does not hold them."""
    f = fused_kernel(lambda x, w: op.nn.relu(op.reshape(op.matmul(x, w), (196, 24))), [(14, 14, 16), (16, 24)])
    sch = s_tir.Schedule(f)
    gemm, flat, relu = sch.get_child_blocks(sch.get_sblock("root"))
    _, j, _, _ = sch.get_loops(gemm)
    jo, _ = sch.split(j, [None, 8])
    sch.reverse_compute_at(flat, jo)
    [race] = output_races(sch)
    assert (race.block, race.output, race.counts.twice) == (sch.get(flat).name_hint, False, 2 * 13 * 24)
    assert "a buffer of the kernel's own" in race.describe()


def test_an_intermediate_recomputed_per_tile_is_no_race():
    """``y[i] = x[i] + x[i + 1]`` over tiles of 4, the producer computed per tile with its one-element halo:
    each element of the producer's buffer is computed by two tiles, each into a copy of its own (the buffer's
    accesses all sit under the tile loop)."""
    def build(x):
        y = op.nn.relu(x)
        return op.add(op.strided_slice(y, [0], [0], [16]), op.strided_slice(y, [0], [1], [17]))

    sch = s_tir.Schedule(fused_kernel(build, [(17,)]))
    relu, *slices, add = sch.get_child_blocks(sch.get_sblock("root"))
    for b in slices:
        sch.compute_inline(b)
    (i,) = sch.get_loops(add)
    io, _ = sch.split(i, [None, 4])
    sch.compute_at(relu, io)
    blocks = [relu]
    produced = [b for b in blocks if point_counts(sch, b) is not None and point_counts(sch, b).twice]
    assert produced                             # the halo: points computed by two tiles
    assert output_races(sch) == []


def test_loops_of_one_name_are_told_apart():
    """A placed block's loops can share a name (``ax1_0`` of a split above ``ax1_0`` of the placement, as in
    ResNet-50's conv epilogues); keyed by name, the inner would shadow the outer in ``i * 4 + j`` and the
    check would see 8 of the 32 points run, each 4 times."""
    import tvm_ffi
    from tvm import tirx

    sch = s_tir.Schedule(fused_kernel(lambda x: op.nn.relu(x), [(32,)]))
    blk = sch.get_child_blocks(sch.get_sblock("root"))[0]
    sch.split(sch.get_loops(blk)[0], [8, 4])
    f = sch.mod["main"]
    outer, inner = (sch.get(lp).loop_var for lp in sch.get_loops(blk))
    twin = tirx.Var(outer.name, inner.ty)
    body = tvm_ffi.structural_map(f.body, (tvm.ir.Var, lambda v: twin if v.same_as(inner) else v))
    sch = s_tir.Schedule(tirx.PrimFunc(f.params, body, f.ret_type, f.attrs))
    blk = sch.get_child_blocks(sch.get_sblock("root"))[0]
    names = [sch.get(lp).loop_var.name for lp in sch.get_loops(blk)]
    assert names[0] == names[1]
    assert point_counts(sch, blk) == PointCounts(domain=32, twice=0, missed=0, outside=0)
