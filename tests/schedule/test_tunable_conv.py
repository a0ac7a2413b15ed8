"""The tunable Conv2d space: the rule's own schedule is its first point, every point fits UB and computes the
unscheduled kernel exactly (W1's conv, a strided one, a 1x1, an odd width), and a sampled decision replays."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import s_tir
from tvm.relax import op

from tests.schedule.kernels import HOST, NATIVE, assert_decision_replays, fused_kernel
from tvm_ascendfuse.analysis.verify_ub import VerifyUBCapacity
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.schedule.conv import Conv2dRule
from tvm_ascendfuse.schedule.conv_schedule import ConvChoice, ConvTiles, conv_candidates
from tvm_ascendfuse.schedule.fast_math import use_fast_math
from tvm_ascendfuse.schedule.hostvec import HostVector
from tvm_ascendfuse.schedule.tunable import candidate_schedules, ub_fits
from tvm_ascendfuse.schedule.tuned import workload_module
from tvm_ascendfuse.target import get_target, make_target
from tvm_ascendfuse.tune import extract_kernels
from tvm_ascendfuse.workloads import conv_bn_relu
from tests.helpers import assert_close

NPU = get_target("ascend910b")
# explicit hosts of both vector widths, for structure only (code built for them may not run on this machine)
AVX512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
AVX2 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"})


def _conv_relu(stride, pad):
    return lambda x, w, b: op.nn.relu(op.add(op.nn.conv2d(x, w, strides=stride, padding=[pad] * 4), b))


def _fused(xs, ws, stride, pad):
    func = fused_kernel(_conv_relu(stride, pad), [xs, ws, (1, ws[0], 1, 1)])
    return workload_module(use_fast_math(func.without_attr("global_symbol")))


def _w1_small():
    """W1's conv (3x3 pad 1 + folded BN + ReLU, constant packed weight) on a 16x16 plane, AVX-512 host."""
    (k,) = [k for k in extract_kernels(import_onnx(conv_bn_relu(16, 32, 16)), NPU, NATIVE) if k.rule == "conv2d"]
    return k.workload


CASES = {
    # name: (workload, host)
    "w1": (_w1_small, NATIVE),
    "3x3_s2": (lambda: _fused((1, 8, 15, 15), (32, 8, 3, 3), 2, 1), NATIVE),
    "1x1": (lambda: _fused((1, 24, 10, 10), (48, 24, 1, 1), 1, 0), HOST),
    "3x3_odd_width": (lambda: _fused((1, 8, 12, 13), (16, 8, 3, 3), 1, 1), HOST),
    # small plane: input-channel chunks outside the pixel loops, the accumulator of the plane held in UB (at
    # both vector widths: test_plane_chunk_space_at_both_widths)
    "3x3_plane_chunks": (lambda: _fused((1, 64, 14, 14), (64, 64, 3, 3), 1, 1), NATIVE),
    # epilogue on channel vectors with column blocks that do not divide the width: the last block's store
    # transpose is predicated and stays a plain copy
    "3x3_lane_epilogue_ragged_columns": (lambda: _fused((1, 16, 24, 24), (32, 16, 3, 3), 1, 1), NATIVE),
}


def _run(mod, inputs):
    mod = tvm.IRModule({"main": mod["main"].with_attr("global_symbol", "main")})
    args = [tvm.runtime.tensor(x) for x in inputs]
    tvm.compile(mod, target="llvm")["main"](*args)
    return args[-1].numpy()


@pytest.mark.parametrize("name", list(CASES))
def test_every_point_fits_ub_and_matches_the_unscheduled_kernel(name):
    make, host = CASES[name]
    workload = make()
    points = candidate_schedules(workload, "conv2d", NPU, host)
    # untuned = first point; a row padded to whole register blocks (column_pad.py) is a rewrite into a new
    # schedule, which a trace cannot record: the space is the unpadded kernel's (the 13-wide case pads)
    default = Conv2dRule(column_pad=False).apply(workload["main"], NPU, host)
    assert tvm_ffi.structural_equal(points[0][1].mod, default.mod)
    padded = "columns padded to" in Conv2dRule().apply(workload["main"], NPU, host).mod.script()
    assert padded == (name == "3x3_odd_width"), name
    choices = [c for c, _ in points]
    assert len(points) >= 4 and len(set(choices)) == len(choices)
    assert len({tvm_ffi.structural_hash(s.mod) for _, s in points}) == len(points)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in workload["main"].params]
    expected = _run(workload, inputs)
    for choice, sch in points:
        assert ub_fits(sch.mod["main"], NPU), choice
        VerifyUBCapacity(NPU)(sch.mod)                          # raises UBCapacityError on overflow
        assert_close(_run(sch.mod, inputs), expected, rtol=1e-4, atol=1e-4, err_msg=str(choice))


def test_plane_chunk_space_at_both_widths():
    """Every point of the small-plane case keeps the channel chunks, and the space has several points, with
    16 and with 8 lanes. (On a 7x7 plane, 64 output channels in 7 rows give the chunks too few tasks: AVX-512
    declines them, AVX2's space holds three register blocks.)"""
    make, _ = CASES["3x3_plane_chunks"]
    for host in (AVX512, AVX2):
        points = candidate_schedules(make(), "conv2d", NPU, host)
        assert len(points) >= 4, host
        for choice, sch in points:
            script = sch.mod.script()
            assert "rc_0" in script and "yy_0" in script, (host, choice)      # chunked reduction, row blocks


def test_w1_space_varies_blocks_of_rows_and_register_blocks():
    points = candidate_schedules(_w1_small(), "conv2d", NPU, NATIVE)
    default = points[0][0]
    assert default.row_blocks is not None
    assert len({c.row_blocks for c, _ in points}) > 1 and len({c.tiles for c, _ in points}) > 1
    other = next(s for c, s in points if c.row_blocks != default.row_blocks)
    assert "row_blocks=" in other.mod.script() and "row_blocks=" not in points[0][1].mod.script()


def test_candidates_respect_the_ub_of_the_target():
    hv = HostVector(512, 32, 2)
    default = ConvChoice(ConvTiles(16, 2, 8), None)
    big = conv_candidates(default, 256, 56, "float32", hv, NPU)
    tiny = make_target("ascend910b", ub_bytes=1024, ub_reserved_bytes=0)   # 2 copies of 8 vectors at most
    small = conv_candidates(default, 256, 56, "float32", hv, tiny)
    assert big[0] == small[0] == default and 1 < len(small) < len(big)
    assert all(2 * c.tiles.ocb * c.tiles.owr * 4 <= tiny.ub_usable for c in small[1:])
    acc = hv.accumulators
    assert all(c.tiles.ocr * c.tiles.owr <= acc and (56 % c.tiles.owr == 0 or c.tiles.owr == acc // c.tiles.ocr)
               and 4 * c.tiles.ocr * c.tiles.owr >= acc for c in big[1:])
    # the path's own check (a small plane's channel chunks) filters further; row blocks multiply
    narrow = conv_candidates(default, 256, 56, "float32", hv, NPU, accept=lambda t: t.ocr <= 2)
    assert all(c.tiles.ocr <= 2 for c in narrow[1:]) and len(narrow) < len(big)
    rows = conv_candidates(ConvChoice(ConvTiles(16, 2, 8), 2), 256, 56, "float32", hv, NPU, row_blocks=[2, 4, 8])
    assert len(rows) == 3 * len(big) and {c.row_blocks for c in rows} == {2, 4, 8}


def test_sampled_decision_is_in_the_trace_and_replays():
    workload = _w1_small()
    assert_decision_replays(workload, "conv2d", NATIVE)


def test_a_database_with_the_register_transpose_opens_in_a_fresh_process(tmp_path):
    """Conv traces tensorize with the register-transpose intrinsic, which the rule registers on first use;
    a compile that reads the database before scheduling any conv must still parse those traces."""
    import subprocess
    import sys

    from tvm.s_tir import meta_schedule as ms

    from tvm_ascendfuse.schedule.tuned import RECORDS_FILE, WORKLOADS_FILE

    workload = _w1_small()
    sch = s_tir.Schedule(workload)
    Conv2dRule().schedule(sch, NPU, NATIVE)
    if "ascendfuse_transpose" not in str(sch.trace):
        pytest.skip("this host's register block has no transpose intrinsic (needs 8 x 16 fp32 lanes)")
    db = ms.database.JSONDatabase(path_workload=str(tmp_path / WORKLOADS_FILE),
                                  path_tuning_record=str(tmp_path / RECORDS_FILE), allow_missing=True)
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(workload), [1e-3], NATIVE,
                                                     ms.arg_info.ArgInfo.from_prim_func(workload["main"])))
    code = ("import sys; from tvm_ascendfuse.schedule.tuned import open_database; "
            "print(len(open_database(sys.argv[1]).get_all_tuning_records()))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr[-2000:]
