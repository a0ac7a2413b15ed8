"""Input-side register transpose (transpose.py): the 16-channel x 8-column shuffle network is an exact
transpose, and pointwise convs whose NCHW input is staged NCHW[16]c through it compute the same numbers as
the gathered copy; widths that are not a multiple of 8 (and strided reads) keep the gather."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir
from tvm.relax import op
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script.builder import ir as T

from tests.schedule.kernels import NATIVE, NPU, check_rule, fused_kernel
from tvm_ascendfuse.schedule.conv import Conv2dRule
from tvm_ascendfuse.schedule.transpose import in_transpose_intrin, in_transpose_lanes

AVX512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})


@pytest.mark.parametrize("lanes", [16, 8])
def test_network_lanes_are_a_transpose(lanes):
    """Every output lane of the shuffle network (simulated on lane ids) is the transposed element: 16
    channels (AVX-512) and 8 (AVX2, or a channel count 16 does not divide)."""
    vals, outs = in_transpose_lanes(lanes, 8)
    a = np.arange(lanes * 8).reshape(lanes, 8)
    env = [a[i] for i in range(lanes)]
    for x, y, idx in vals:
        env.append(np.concatenate([env[x], env[y]])[idx])
    np.testing.assert_array_equal(np.stack([env[o] for o in outs]), a.T)


def _staging_func(c, h, w):
    """A standalone NCHW -> NCHW[16]c copy: loops (n, c/16, h, w/8, c%16, w%8), ready to tensorize."""
    i64 = T.int64
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("main")
            A = T.arg("A", T.buffer((i64(1), i64(c), i64(h), i64(w)), "float32"))
            B = T.arg("B", T.buffer((i64(1), i64(c // 16), i64(h), i64(w), i64(16)), "float32"))
            with T.grid(i64(1), i64(c), i64(h), i64(w)) as (n, ci, y, x):
                with T.sblock("stage"):
                    vn, vc, vy, vx = T.axis.remap("SSSS", [n, ci, y, x])
                    T.buffer_store(B, A[vn, vc, vy, vx], [vn, vc // 16, vy, vx, vc % 16])
    return ib.get()


def test_intrinsic_transposes_exactly():
    """The tensorized staging (shuffle network compiled for the host) equals numpy's NCHW[16]c layout of
    random data: a wrong shuffle index moves some element and fails here."""
    c, h, w = 32, 3, 16
    sch = s_tir.Schedule(tvm.IRModule({"main": _staging_func(c, h, w)}))
    blk = sch.get_sblock("stage")
    n, ci, y, x = sch.get_loops(blk)
    co, cl = sch.split(ci, [None, 16])
    xo, xi = sch.split(x, [None, 8])
    sch.reorder(n, co, y, xo, cl, xi)
    sch.tensorize(cl, in_transpose_intrin("float32", 16, 8))
    assert "T.Shuffle" in sch.mod.script()
    lib = tvm.compile(sch.mod, target=NATIVE)
    a = np.random.default_rng(0).standard_normal((1, c, h, w)).astype("float32")
    b = tvm.runtime.tensor(np.zeros((1, c // 16, h, w, 16), "float32"))
    lib["main"](tvm.runtime.tensor(a), b)
    np.testing.assert_array_equal(b.numpy(), a.reshape(1, c // 16, 16, h, w).transpose(0, 1, 3, 4, 2))


def test_only_16x8_fp32_tiles():
    assert in_transpose_intrin("float32", 16, 8) is not None
    assert in_transpose_intrin("float16", 16, 8) is None and in_transpose_intrin("float32", 8, 8) is None


def _pointwise(xs, ws, stride=1, residual=False):
    oh = (xs[2] - 1) // stride + 1

    def build(x, w, b, *r):
        y = op.add(op.nn.conv2d(x, w, strides=stride), b)
        return op.nn.relu(op.add(y, r[0]) if residual else y)

    shapes = [xs, ws, (1, ws[0], 1, 1)] + ([(1, ws[0], oh, (xs[3] - 1) // stride + 1)] if residual else [])
    return fused_kernel(build, shapes).with_attr("layout_free_buffers", [1])


# NCHW[16]c input forced on small planes (the default asks for >= 2 KiB planes and no plane chunks)
RULE = {"nchwc_min_plane": 256, "plane_chunks": False}


@pytest.mark.parametrize("xs,ws,residual", [((1, 32, 5, 16), (48, 32, 1, 1), False),
                                            ((2, 16, 3, 24), (32, 16, 1, 1), True)])
def test_pointwise_input_staged_through_shuffles(xs, ws, residual):
    """Width a multiple of 8: the staging copy is tensorized (``pad_temp_o``), numbers equal the
    unscheduled kernel, and without the option the gathered copy is back."""
    func = _pointwise(xs, ws, residual=residual)
    assert "pad_temp_o" in Conv2dRule(**RULE).apply(func, NPU, AVX512).mod.script()
    assert "pad_temp_o" not in Conv2dRule(**RULE, transpose_input=False).apply(func, NPU, AVX512).mod.script()
    check_rule(Conv2dRule(**RULE), func, host=NATIVE)


@pytest.mark.parametrize("xs,ws,stride", [((1, 32, 6, 12), (32, 32, 1, 1), 1),
                                          ((1, 16, 7, 17), (16, 16, 1, 1), 1),
                                          ((1, 32, 9, 32), (32, 32, 1, 1), 2)])
def test_other_widths_keep_the_gather(xs, ws, stride):
    """Widths that are not a multiple of 8 and the strided gather of a downsample conv fall back to the
    lane-by-lane copy, exactly."""
    func = _pointwise(xs, ws, stride)
    script = Conv2dRule(**RULE).apply(func, NPU, AVX512).mod.script()
    assert "pad_temp_o" not in script and "_o\"" not in script.split("conv2d_nchw")[0]
    check_rule(Conv2dRule(**RULE), func, host=NATIVE)


def test_a_database_with_the_input_transpose_opens_in_a_fresh_process(tmp_path):
    """A tuned pointwise conv's trace tensorizes with the input-side intrinsic too; opening the database in a
    process that has not scheduled a conv yet must register it (and the output side) by name."""
    import subprocess
    import sys

    from tvm.s_tir import meta_schedule as ms

    from tvm_ascendfuse.schedule.tuned import RECORDS_FILE, WORKLOADS_FILE

    func = _pointwise((1, 32, 5, 16), (48, 32, 1, 1))
    sch = Conv2dRule(**RULE).apply(func, NPU, AVX512)
    assert "ascendfuse_transpose_in_16x8_float32" in str(sch.trace)
    workload = tvm.IRModule({"main": func})
    db = ms.database.JSONDatabase(path_workload=str(tmp_path / WORKLOADS_FILE),
                                  path_tuning_record=str(tmp_path / RECORDS_FILE), allow_missing=True)
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(workload), [1e-3], AVX512,
                                                     ms.arg_info.ArgInfo.from_prim_func(func)))
    code = ("import sys; from tvm_ascendfuse.schedule.tuned import open_database; "
            "print(len(open_database(sys.argv[1]).get_all_tuning_records()))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr[-2000:]


def test_strided_downsample_with_residual_never_tries_the_intrinsic(monkeypatch, capfd):
    """A stride-2 1x1 conv + residual (RegNet's and ResNet's downsample shortcut) stages a subsampled input
    (columns ``2 * w``): 8 output columns are not 8 contiguous input elements, so the intrinsic is not even
    tried (a refused tensorize on this kernel once made TVM print printer warnings at compile time); the
    gathered copy computes the same numbers, and nothing reaches stderr."""
    refused = []
    tensorize = s_tir.Schedule.tensorize

    def spy(self, *args, **kwargs):
        try:
            return tensorize(self, *args, **kwargs)
        except s_tir.ScheduleError:
            refused.append(args)
            raise

    monkeypatch.setattr(s_tir.Schedule, "tensorize", spy)
    func = _pointwise((1, 32, 8, 32), (64, 32, 1, 1), stride=2, residual=True)
    check_rule(Conv2dRule(**RULE), func, host=NATIVE)
    assert not refused
    assert "Warning" not in capfd.readouterr().err
