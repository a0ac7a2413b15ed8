"""Precision repair by measurement: a kernel whose fp16 output overflows is found by --verify and kept in
float32, and the model agrees again."""

import numpy as np
from tvm import relax

import tvm_ascendfuse as af


def _overflowing_block():
    """relu(x @ W1) reaches ~1e5 (fp16 stops at 65504) and goes through GM to a second kernel that scales it
    back: stored in fp16 it is inf, and so is the output."""
    rng = np.random.default_rng(0)
    w1 = rng.uniform(-6e4, 6e4, (64, 64)).astype("float32")       # representable in fp16
    w2 = (rng.standard_normal((64, 64)) * 1e-5).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((32, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = relax.op.nn.relu(relax.op.matmul(x, relax.const(w1)))
            # h read twice (GEMM and a scaled residual): it goes through GM
            scaled = relax.op.multiply(h, relax.const(np.float32(1e-5)))
            out = bb.emit_output(relax.op.add(relax.op.matmul(h, relax.const(w2)), scaled))
        bb.emit_func_output(out)
    return bb.get()


def test_overflowing_kernel_kept_in_float32():
    mod = _overflowing_block()
    broken = af.compile_model(mod, portable=True, verify=True, precision_mode="force_fp16", precision_repair=False)
    assert not broken.verification.ok
    first = broken.verification.bisection["first_bad_kernel"]
    assert first is not None and "relu" in " ".join(first["ops"])
    repaired = af.compile_model(mod, portable=True, verify=True, precision_mode="force_fp16")
    assert repaired.verification.ok
    repair = repaired.report.sections["precision"]["repair"]
    assert repair["ok"] and len(repair["kept_fp32"]) == 1
    kept = repair["kept_fp32"][0]
    assert "relu" in " ".join(kept["ops"]) and kept["model_max_rel_before"] == float("inf")
    assert repair["model_cosine_after"] >= 0.999
    # the kept kernel writes float32, the rest of the build still reads/writes fp16 where it can
    rows = {k["name"]: k for k in repaired.report.kernels}
    assert any(r.get("source_kernel", r["name"]) == kept["kernel"] and r.get("precision", {}).get("output")
               == "float32" for r in rows.values())


def test_no_repair_for_a_build_that_agrees():
    rng = np.random.default_rng(1)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = relax.op.nn.relu(relax.op.matmul(x, relax.const(rng.standard_normal((32, 32)).astype("float32"))))
            out = bb.emit_output(relax.op.matmul(h, relax.const(rng.standard_normal((32, 32)).astype("float32"))))
        bb.emit_func_output(out)
    res = af.compile_model(bb.get(), portable=True, verify=True, precision_mode="force_fp16")
    assert res.verification.ok and "repair" not in res.report.sections["precision"]
