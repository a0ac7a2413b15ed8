"""Bf16MatmulRule: the GEMMs of a bf16 build on the host's bf16 dot product (AVX512-BF16), checked against
float32 numpy on the bf16-rounded operands by the output's scale; float32 and fp16 builds, and hosts without
the instruction, keep the float32 GEMM rule."""

import numpy as np
import pytest
from tvm import relax

import tvm_ascendfuse as af
from tvm_ascendfuse.schedule.hostvec import BF16_DOT_ENV, bf16_dot_pays, has_bf16_dot
from tvm_ascendfuse.schedule.bf16_gemm import MAX_TILE_VECTORS, register_tile
from tvm_ascendfuse.target import get_target
from tests.helpers import round_to_bf16, run_vm

HOST_BF16 = has_bf16_dot(get_target("ascend910b").host_target())


@pytest.fixture(autouse=True)
def _dot_product_on(monkeypatch):
    """The rule's numbers are checked wherever the instruction exists, also on CPUs where it is not chosen
    by default (``bf16_dot_pays``)."""
    monkeypatch.setenv(BF16_DOT_ENV, "on")


def _gemm(m, k, n, transposed=False, seed=0):
    """relu(x W + b), W given as (K, N) or, ``transposed``, as (N, K) (a Linear layer's weight)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = relax.op.permute_dims(relax.const(np.ascontiguousarray(w.T))) if transposed else relax.const(w)
            y = relax.op.add(relax.op.matmul(x, wt), relax.const(b))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get(), w, b



def _rules(res):
    return {k.get("rule") for k in res.report.kernels if "matmul" in (k.get("ops") or [])}


@pytest.mark.skipif(not HOST_BF16, reason="the host has no AVX512-BF16")
@pytest.mark.parametrize("m,k,n,transposed", [(64, 256, 192, False), (48, 96, 64, True), (128, 768, 96, False)])
def test_bf16_build_uses_the_dot_product(m, k, n, transposed):
    mod, w, b = _gemm(m, k, n, transposed)
    res = af.compile_model(mod, precision_mode="force_bf16")
    assert _rules(res) == {"matmul_bf16"}
    notes = [n for ns in res.report.sections["schedule_notes"].values() for n in ns]
    assert any("bf16 dot product" in n for n in notes), notes
    x = np.random.default_rng(1).standard_normal((m, k)).astype("float32")
    got = run_vm(res.executable, [x])
    # the build's numbers: A and W rounded to bf16, products summed in float32
    want = np.maximum(round_to_bf16(x).astype(np.float64) @ round_to_bf16(w).astype(np.float64) + b, 0)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    # and within bf16's rounding of the float32 model
    exact = np.maximum(x @ w + b, 0)
    cos = float((got.ravel() @ exact.ravel()) / np.linalg.norm(got) / np.linalg.norm(exact))
    assert cos >= 0.999


@pytest.mark.skipif(not HOST_BF16, reason="the host has no AVX512-BF16")
def test_bf16_model_input_read_by_the_dot_product():
    """A bf16 model: its input, widened to float32 in front of the GEMM (operand_cast), is the rule's A."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((256, 192)) / 16).astype(ml_dtypes.bfloat16)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 256), "bfloat16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.matmul(x, relax.const(w))))
        bb.emit_func_output(out)
    res = af.compile_model(bb.get())
    assert _rules(res) == {"matmul_bf16"}
    xv = rng.standard_normal((64, 256)).astype(ml_dtypes.bfloat16)
    got = run_vm(res.executable, [xv]).astype("float32")
    want = np.maximum(xv.astype("float32") @ w.astype("float32"), 0)
    assert np.abs(got - want).max() <= 2 ** -7 * np.abs(want).max()     # the output's bf16 rounding


def test_float32_and_fp16_builds_keep_the_float32_rule():
    mod, _, _ = _gemm(64, 256, 192)
    assert _rules(af.compile_model(mod)) == {"matmul"}
    assert _rules(af.compile_model(mod, precision_mode="force_fp16")) == {"matmul"}


def test_hosts_without_the_instruction_keep_the_float32_rule():
    mod, _, _ = _gemm(64, 256, 192)
    res = af.compile_model(mod, precision_mode="force_bf16", portable=True)     # generic x86-64
    assert _rules(res) == {"matmul"}


@pytest.mark.parametrize("m,k,n", [(16, 30, 40), (197, 64, 64)], ids=["K%2,N%16", "prime rows"])
def test_shapes_the_tile_does_not_fit_go_to_the_float32_rule(m, k, n):
    mod, _, _ = _gemm(m, k, n)
    assert "matmul_bf16" not in _rules(af.compile_model(mod, precision_mode="force_bf16"))


def test_the_dot_product_only_where_it_pays(monkeypatch):
    """Taken on the CPUs where it measured faster than float32 FMAs (Zen 4/5), not on an Intel core with
    the same instruction (measured 1.35-1.46x slower there), never without the instruction; the environment
    variable overrides."""
    import tvm

    def host(mcpu, mattr=()):
        return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "mattr": list(mattr)})

    monkeypatch.delenv(BF16_DOT_ENV)
    assert bf16_dot_pays(host("znver4")) and bf16_dot_pays(host("znver5"))
    assert not bf16_dot_pays(host("sapphirerapids"))
    assert not bf16_dot_pays(host("rocketlake", ["+avx512bf16"]))
    assert not bf16_dot_pays(host("skylake-avx512"))
    monkeypatch.setenv(BF16_DOT_ENV, "on")
    assert bf16_dot_pays(host("sapphirerapids")) and not bf16_dot_pays(host("skylake-avx512"))
    monkeypatch.setenv(BF16_DOT_ENV, "off")
    assert not bf16_dot_pays(host("znver4"))
    # the rule follows the gate
    monkeypatch.delenv(BF16_DOT_ENV)
    mod, _, _ = _gemm(64, 256, 192)
    want = {"matmul_bf16"} if bf16_dot_pays(get_target("ascend910b").host_target()) else {"matmul"}
    assert _rules(af.compile_model(mod, precision_mode="force_bf16")) == want


def test_register_tile_stays_on_the_stack():
    """The tile's buffer below TVM's stack limit (a heap workspace keeps it out of registers)."""
    for rows, vectors in [(128, 192), (128, 48), (8, 4), (7, 3)]:
        mr, nv = register_tile(rows, vectors, 16)
        assert rows % mr == 0 and vectors % nv == 0 and mr * nv <= MAX_TILE_VECTORS
