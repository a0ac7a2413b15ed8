"""UB verification: counted on the scheduled TIR, fails the build on overflow, passes on the workloads."""

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from tvm_ascendfuse.analysis.ub_usage import kernel_usage, normalize_scope_aliases
from tvm_ascendfuse.analysis.verify_ub import VerifyUBCapacity
from tvm_ascendfuse.errors import UBCapacityError
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.report import FusionReport
from tvm_ascendfuse.target import get_target
from tvm_ascendfuse.workloads import WORKLOADS

from tests.helpers import assert_close, compile_ours, random_inputs, run_reference, run_vm, tol


def staged_kernel(rows: int, scope: str):
    """y = 2x + 1 through one on-chip buffer of rows x 64 floats (hand-written, no rule involved)."""

    @T.prim_func(s_tir=True)
    def kernel(A: T.Buffer((rows, 64), "float32"), B: T.Buffer((rows, 64), "float32")):
        U = T.sblock_alloc_buffer((rows, 64), "float32", scope=scope)
        for i, j in T.grid(rows, 64):
            with T.sblock("load"):
                vi, vj = T.axis.remap("SS", [i, j])
                U[vi, vj] = A[vi, vj] * T.float32(2)
        for i, j in T.grid(rows, 64):
            with T.sblock("store"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = U[vi, vj] + T.float32(1)

    return kernel


def test_oversized_schedule_fails_naming_kernel_and_bytes():
    t = get_target("ascend910b")
    mod = tvm.IRModule({"huge_tile": staged_kernel(4096, "local.UB")})    # 1 MiB of UB
    with pytest.raises(UBCapacityError) as err:
        VerifyUBCapacity(t, FusionReport())(mod)
    e = err.value
    assert (e.kernel, e.scope, e.needed, e.available) == ("huge_tile", "local.UB", 4096 * 64 * 4, t.ub_usable)
    assert "huge_tile" in str(e) and str(4096 * 64 * 4) in str(e) and str(t.ub_usable) in str(e)


def test_fitting_schedule_passes_and_is_reported():
    t = get_target("ascend310p")
    report = FusionReport()
    report.set_kernels([{"name": "small_tile", "launches": 1}])
    VerifyUBCapacity(t, report)(tvm.IRModule({"small_tile": staged_kernel(16, "local.UB")}))
    row = report.sections["ub_usage"]["small_tile"]
    assert row["ub_bytes"] == 16 * 64 * 4
    assert row["ub_occupancy_pct"] == pytest.approx(100 * 16 * 64 * 4 / t.ub_usable, abs=0.1)
    assert report.kernels[0]["ub_bytes"] == 16 * 64 * 4


def test_counts_the_compacted_tile_aligned():
    t = get_target("ascend910b")
    usage = kernel_usage("k", staged_kernel(3, "local.UB"), t)       # 3*64*4 = 768 B: already 32 B aligned
    assert usage.bytes("local.UB") == 768
    odd = kernel_usage("k", staged_kernel(1, "local.L0A"), t)        # 256 B padded to the 512 B L0A alignment
    assert odd.raw_bytes("local.L0A") == 256 and odd.bytes("local.L0A") == 512
    assert odd.unaligned("local.L0A")


def test_bare_ub_is_an_alias_and_builds():
    kernel = staged_kernel(8, "ub")
    fixed = normalize_scope_aliases(kernel.with_attr("global_symbol", "main"))
    assert "local.UB" in fixed.script() and 'scope="ub"' not in fixed.script()
    report = FusionReport()
    mod = VerifyUBCapacity(get_target("ascend910b"), report)(tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")}))
    assert report.sections["ub_usage"]["main"]["ub_bytes"] == 8 * 64 * 4
    lib = tvm.compile(mod, target="llvm")
    a = tvm.runtime.tensor(np.arange(512, dtype="float32").reshape(8, 64))
    b = tvm.runtime.tensor(np.zeros((8, 64), "float32"))
    lib["main"](a, b)
    assert_close(b.numpy(), a.numpy() * 2 + 1)


def test_overflow_fails_the_whole_build():
    """Through compile_model: a model whose (hand-scheduled) kernel stages 1 MiB in UB does not build."""
    from tvm import relax

    kernel = staged_kernel(4096, "local.UB").with_attr("tirx.is_scheduled", True).with_attr("global_symbol", "huge_tile")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4096, 64), "float32"))
    with bb.function("main", [x]):
        gv = bb.add_func(kernel, "huge_tile")
        with bb.dataflow():
            out = bb.emit_output(relax.call_tir(gv, [x], relax.TensorType((4096, 64), "float32")))
        bb.emit_func_output(out)
    with pytest.raises(UBCapacityError) as err:
        compile_ours(bb.get(), target="ascend910b")
    assert err.value.kernel.startswith("huge_tile") and err.value.needed == 4096 * 64 * 4


SMALL = {
    "conv_bn_relu": dict(in_channels=8, out_channels=16, hw=10),
    "resnet50": dict(image=32, base_width=8, layers=(1, 1, 1, 1), num_classes=10),
    "bert_layer": dict(seq=16, hidden=64, heads=4, ffn=128),
    "ln_linear_gelu": dict(rows=8, hidden=64, ffn=128),
    "focus_conv": dict(out_channels=8, hw=32),
    "mlp3": dict(rows=8, width=64),
    "llama_block": dict(seq=16, hidden=64, heads=4, ffn=96),
}


@pytest.mark.parametrize("target", ["ascend910b", "ascend310p"])
@pytest.mark.parametrize("workload", ["bert_layer", "llama_block", "conv_bn_relu", "mlp3"])
def test_workload_kernels_fit_and_are_scheduled(workload, target):
    mod = import_onnx(WORKLOADS[workload][0](**SMALL[workload]))
    result = compile_ours(mod, target=target)
    report = result.report
    usage = report.sections["ub_usage"]
    rules = report.sections["schedules"]
    t = get_target(target)
    assert report.kernels and all(k["name"] in usage for k in report.kernels)
    assert all(0 <= usage[k["name"]]["ub_bytes"] <= t.ub_usable for k in report.kernels)
    assert all(rules.get(k["name"]) not in (None, "unscheduled") for k in report.kernels)
    inputs = random_inputs(mod)
    ours, ref = run_vm(result.executable, inputs), run_reference(mod, inputs)
    for a, b in zip(ours if isinstance(ours, list) else [ours], ref if isinstance(ref, list) else [ref]):
        assert_close(a, b, **tol("float32"))
