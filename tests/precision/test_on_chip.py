"""On-chip capacity in the NPU's dtype: a kernel a precision mode stores in 16 bits counts its UB/L1 tiles in
16-bit bytes (grouping, schedule rules, verification); float32 builds count as before."""

import numpy as np
import pytest
from tvm import relax, tirx

import tvm_ascendfuse as af
from tvm_ascendfuse.precision.modes import PrecisionPlan
from tvm_ascendfuse.precision.on_chip import ON_CHIP_FLOAT, grouping_target
from tvm_ascendfuse.schedule.hostvec import HostVector
from tvm_ascendfuse.schedule.matmul import choose_tiles, fits_ub
from tvm_ascendfuse.target import get_target
from tvm_ascendfuse.tiling import TileBuffer, chain_row_block, ub_check
from tests.helpers import run_vm

N = 8192      # one 16-row block's rows: three row buffers double-buffered exceed UB in float32, not in fp16


def _row_max_block():
    """tanh(x + b), then (t - max_row(t)) * t: the grouping puts the max and its epilogue in one kernel only
    when a whole row of each buffer fits UB."""
    rng = np.random.default_rng(0)
    b = rng.standard_normal(N).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, N), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = relax.op.tanh(relax.op.add(x, relax.const(b)))
            m = relax.op.max(t, axis=-1, keepdims=True)
            out = bb.emit_output(relax.op.multiply(relax.op.subtract(t, m), t))
        bb.emit_func_output(out)
    return bb.get(), b


def test_element_bytes():
    t = get_target("ascend910b")
    assert t.element_bytes("float32") == 4 and t.element_bytes("int8") == 1
    half = grouping_target(t, PrecisionPlan("force_fp16"))
    assert half.element_bytes("float32") == 2 and half.element_bytes("float32", "local.L0C") == 4
    assert half.element_bytes("int32") == 4
    # mixed modes keep some ops in float32: the grouping counts float32; float32 plans change nothing
    assert grouping_target(t, PrecisionPlan("allow_mix_precision")) is t
    assert grouping_target(t, PrecisionPlan("force_fp32")) is t
    with pytest.raises(af.errors.TargetError, match="float_bytes"):
        af.target.make_target("ascend910b", float_bytes=3)


def test_capacity_checks_grow_in_16_bits():
    t = get_target("ascend910b")
    half = grouping_target(t, PrecisionPlan("force_fp16"))
    bufs32 = [TileBuffer(16 * N, 4)] * 3
    bufs16 = [TileBuffer(16 * N, half.element_bytes("float32"))] * 3
    assert not ub_check(bufs32, N, t).fits and ub_check(bufs16, N, half).fits
    # a chained GEMM's row block doubles (its accumulator rows in L0C stay float32 and cap it at 128)
    c32 = chain_row_block(1024, 256, 128, 1, 4096, t, 4)
    c16 = chain_row_block(1024, 256, 128, 1, 4096, half, 2)
    assert (c32.tile_elems, c16.tile_elems) == (64, 128)
    # the GEMM rule's K chunk: twice the k steps in the same UB
    hv = HostVector(512, 32, 2)
    k32 = choose_tiles(1024, 1024, 1536, "float32", hv, t)
    k16 = choose_tiles(1024, 1024, 1536, "float32", hv, half)
    assert k16.kc > k32.kc and fits_ub(k16, "float32", half) and not fits_ub(k16, "float32", t)


def test_sixteen_bit_kernel_gets_a_grouping_float32_cannot_fit():
    mod, b = _row_max_block()
    fp32 = af.compile_model(mod, portable=True)
    fp16 = af.compile_model(mod, portable=True, precision_mode="force_fp16")
    ops32 = [k["ops"] for k in fp32.report.kernels]
    ops16 = {k["name"]: k for k in fp16.report.kernels}
    assert ["max"] in ops32                               # float32: the max alone, its epilogue apart
    fused = [k for k in ops16.values() if "max" in k["ops"] and "multiply" in k["ops"]]
    assert fused, [k["ops"] for k in fp16.report.kernels]
    # every kernel is marked, counted in 16-bit bytes and within UB
    cap = fp16.report.sections["target_capacity"]["ub_usable_bytes"]
    for k in fp16.report.kernels:
        assert k.get("on_chip_dtype") == "float16" and k["ub_bytes"] <= cap, k
    assert all("on_chip_dtype" not in k for k in fp32.report.kernels)
    kernels = [f for f in fp16.scheduled_module.functions.values() if isinstance(f, tirx.PrimFunc)]
    assert kernels and all(ON_CHIP_FLOAT in f.attrs for f in kernels)
    # the numbers: within fp16's rounding of float32 numpy, by the output's scale
    x = np.random.default_rng(1).standard_normal((16, N)).astype("float32")
    t = np.tanh(x + b)
    want = (t - t.max(-1, keepdims=True)) * t
    got = run_vm(fp16.executable, [x])
    assert np.abs(got - want).max() <= 4e-3 * np.abs(want).max()


def test_float32_build_unchanged_by_the_marks():
    """A float32 build's kernels carry no mark, and the grouping keeps the max apart (float32 rows)."""
    mod, _ = _row_max_block()
    res = af.compile_model(mod, portable=True)
    for gv, f in res.scheduled_module.functions.items():
        assert not isinstance(f, tirx.PrimFunc) or ON_CHIP_FLOAT not in f.attrs, gv
    assert ["max"] in [k["ops"] for k in res.report.kernels]
