"""Symbolic batch/sequence dims through every pattern family and the pipeline; fp16/bf16; int8 untouched.

One small graph per pattern family (``FAMILIES``), built with a dtype and with static or ``tirx.Var`` dims.
Each is compiled once with our pipeline, run at two concrete sizes and compared with TVM's default build
(tolerance by dtype). Where the math allows symbolic dims, the family's pattern must still fuse; where a
check refuses (a UB working set needs a static row), the refusal must be in the report with its reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax, tirx

from tests.helpers import assert_close, compile_ours, run_reference, run_vm, tol
from tvm_ascendfuse.patterns import pattern_table

ml_dtypes = pytest.importorskip("ml_dtypes")

SWITCH_OF = {s.name: s.switch for s in pattern_table()}
H = 16          # static hidden size (rows of UB tiles stay static)


def _const(shape, dtype, seed=1, scale=1.0):
    arr = (np.random.default_rng(seed).standard_normal(shape) * scale).astype("float32")
    return relax.const(arr.astype(_np_dtype(dtype)), dtype)


def _np_dtype(dtype):
    return ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype


def _build(params, body):
    bb = relax.BlockBuilder()
    vs = [relax.Var(n, relax.TensorType(s, d)) for n, s, d in params]
    with bb.function("main", vs):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *vs))
        bb.emit_func_output(out)
    return bb.get()


# Each family: (switch of the pattern that should take it, builder(dtype, b, s) -> module). b, s: batch and
# sequence dims (ints or tirx.Vars).
def conv(dt, b, s):
    def body(bb, x):
        y = bb.emit(relax.op.nn.conv2d(x, _const((8, 4, 3, 3), dt, 2, 0.2), padding=[1, 1, 1, 1]))
        return relax.op.nn.relu(bb.emit(relax.op.add(y, _const((1, 8, 1, 1), dt, 3))))
    return _build([("x", (b, 4, 6, 6), dt)], body)


def matmul(dt, b, s):
    def body(bb, x):
        y = bb.emit(relax.op.matmul(x, _const((H, 32), dt, 2, 0.25)))
        return relax.op.nn.gelu(bb.emit(relax.op.add(y, _const((32,), dt, 3))))
    return _build([("x", (b, s, H), dt)], body)


def layer_norm_matmul(dt, b, s):
    def body(bb, x):
        ln = bb.emit(relax.op.nn.layer_norm(x, _const((H,), dt, 2), _const((H,), dt, 3), axes=[-1]))
        return relax.op.matmul(ln, _const((H, 24), dt, 4, 0.25))
    return _build([("x", (b, s, H), dt)], body)


def add_layer_norm(dt, b, s):
    def body(bb, x, r):
        a = bb.emit(relax.op.add(x, r))
        return relax.op.nn.layer_norm(a, _const((H,), dt, 2), _const((H,), dt, 3), axes=[-1])
    return _build([("x", (b, s, H), dt), ("r", (b, s, H), dt)], body)


def add_rms_norm(dt, b, s):
    def body(bb, x, r):
        return relax.op.nn.rms_norm(bb.emit(relax.op.add(x, r)), _const((H,), dt, 2), axes=[-1])
    return _build([("x", (b, s, H), dt), ("r", (b, s, H), dt)], body)


def softmax(dt, b, s):
    def body(bb, x):
        y = bb.emit(relax.op.multiply(x, relax.const(0.25, dt)))
        return relax.op.nn.softmax(bb.emit(relax.op.add(y, _const((H,), dt, 2))), axis=-1)
    return _build([("x", (b, s, H), dt)], body)


def attention(dt, b, s):
    def body(bb, q, k, v):
        kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
        qk = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(q, kt)), relax.const(0.35, dt)))
        return relax.op.matmul(bb.emit(relax.op.nn.softmax(qk, axis=-1)), v)
    shape = (b, 2, s, 8)
    return _build([("q", shape, dt), ("k", shape, dt), ("v", shape, dt)], body)


def swiglu(dt, b, s):
    def body(bb, x):
        g = bb.emit(relax.op.matmul(x, _const((H, 24), dt, 2, 0.25)))
        u = bb.emit(relax.op.matmul(x, _const((H, 24), dt, 3, 0.25)))
        return relax.op.multiply(bb.emit(relax.op.nn.silu(g)), u)
    return _build([("x", (b, s, H), dt)], body)


def elementwise(dt, b, s):
    def body(bb, x, y):
        t = bb.emit(relax.op.multiply(bb.emit(relax.op.tanh(x)), bb.emit(relax.op.sigmoid(y))))
        return relax.op.add(t, relax.const(1.0, dt))
    return _build([("x", (b, s, H), dt), ("y", (b, s, H), dt)], body)


def reduction_epilogue(dt, b, s):
    """No pattern takes x - mean(x): the cost-based grouping (or FuseOps) must."""
    def body(bb, x):
        m = bb.emit(relax.op.mean(x, axis=[-1], keepdims=True))
        return relax.op.nn.relu(bb.emit(relax.op.subtract(x, m)))
    return _build([("x", (b, s, H), dt)], body)


FAMILIES = {
    "conv": ("TbeConvElemwiseFusionPass", conv),
    "matmul": ("TbeMatmulElemwiseFusionPass", matmul),
    "layer_norm_matmul": ("TbeLayerNormMatmulFusionPass", layer_norm_matmul),
    "add_layer_norm": ("TbeAddLayerNormFusionPass", add_layer_norm),
    "add_rms_norm": ("TbeAddRmsNormFusionPass", add_rms_norm),
    "softmax": ("TbeSoftmaxFusionPass", softmax),
    "attention": ("TbeAttentionFusionPass", attention),
    "swiglu": ("TbeSwiGluFusionPass", swiglu),
    "elementwise": ("TbeEltwiseFusionPass", elementwise),
    "reduction_epilogue": (None, reduction_epilogue),
}


def _inputs(mod, sizes: dict, dtype, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for p in mod["main"].params:
        shape = [int(d) if isinstance(d, tirx.IntImm) else sizes[d.name] for d in p.ty.shape]
        out.append(rng.standard_normal(shape).astype("float32").astype(_np_dtype(dtype)))
    return out


def _as_list(x):
    return x if isinstance(x, list) else [x]


def _compare(mod, result, sizes, dtype):
    inputs = _inputs(mod, sizes, dtype)
    ours, ref = _as_list(run_vm(result.executable, inputs)), _as_list(run_reference(mod, inputs))
    for a, b in zip(ours, ref):
        assert a.shape == b.shape
        assert_close(a.astype("float32"), b.astype("float32"), **tol(dtype))


def _fused_or_refused(result, switch):
    """The family's pattern fused; or, if refused, the report says why (never silently dropped)."""
    if switch is None:
        return True
    rec = result.report.get(switch)
    if rec.effect_times >= 1:
        return True
    assert rec.not_effective, f"{switch}: neither fused nor a recorded refusal: {rec.to_dict()}"
    return False


def _kernel_count(result):
    return sum(k["launches"] for k in result.report.kernels)


# Families whose UB row runs along the sequence dim (attention's softmax row is s keys long): a symbolic s
# cannot bound the working set, so the pattern refuses (with the reason in the report) and TVM's lowering
# takes over. Every other family keeps its fusion with symbolic b and s.
SEQ_IN_ROW = {"attention"}


def _static_kernels(family):
    switch, make = FAMILIES[family]
    static = compile_ours(make("float32", 3, 7))
    assert _fused_or_refused(static, switch), f"{family}: the static graph must fuse"
    return _kernel_count(static)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_symbolic_batch_and_seq(family):
    """b and s symbolic: compile once, run at two sizes (one odd), same numbers as TVM default."""
    switch, make = FAMILIES[family]
    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")
    mod = make("float32", b, s)
    result = compile_ours(mod)
    for sizes in ({"b": 1, "s": 4}, {"b": 3, "s": 7}):
        _compare(mod, result, sizes, "float32")
    fused = _fused_or_refused(result, switch)
    if family in SEQ_IN_ROW:
        assert not fused and any(e["reason"] for e in result.report.get(switch).not_effective)
        return
    # symbolic dims cost no fusion: the same number of kernels as the static graph
    assert fused, f"{family}: symbolic dims lost the fusion"
    assert _kernel_count(result) == _static_kernels(family), result.report.kernels


@pytest.mark.parametrize("family", sorted(SEQ_IN_ROW))
def test_symbolic_batch_only_keeps_row_fusion(family):
    """With only the batch symbolic, the row is static again and the family fuses."""
    switch, make = FAMILIES[family]
    mod = make("float32", tirx.Var("b", "int64"), 7)
    result = compile_ours(mod)
    for sizes in ({"b": 1}, {"b": 3}):
        _compare(mod, result, sizes, "float32")
    assert _fused_or_refused(result, switch), result.report.get(switch).to_dict()
    assert _kernel_count(result) == _static_kernels(family), result.report.kernels


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_half_precision(family, dtype):
    """fp16 and bf16 (TVM's llvm backend compiles both; bf16 is emulated in fp32, arrays via ml_dtypes) at
    dtype tolerance. bf16 once gave |err| ~0.9 on sigmoid: fast-math Lets duplicated by BF16 legalization."""
    switch, make = FAMILIES[family]
    mod = make(dtype, 2, 5)
    inputs = _inputs(mod, {}, dtype)
    try:
        ref = _as_list(run_reference(mod, inputs))
    except Exception as err:   # a TVM limitation, listed rather than blamed on the plugin
        pytest.xfail(f"TVM default cannot build {family} in {dtype}: {str(err).strip().splitlines()[-1][:150]}")
    result = compile_ours(mod)
    for a, b in zip(_as_list(run_vm(result.executable, inputs)), ref):
        assert_close(a.astype("float32"), b.astype("float32"), **tol(dtype))
    _fused_or_refused(result, switch)


def test_symbolic_through_pipeline_graph_fusion():
    """Decomposed LayerNorm (recognised by a graph-fusion pass) with symbolic b, s."""
    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")

    def body(bb, x):
        mean = bb.emit(relax.op.mean(x, axis=[-1], keepdims=True))
        d = bb.emit(relax.op.subtract(x, mean))
        var = bb.emit(relax.op.mean(bb.emit(relax.op.multiply(d, d)), axis=[-1], keepdims=True))
        den = bb.emit(relax.op.sqrt(bb.emit(relax.op.add(var, relax.const(1e-5, "float32")))))
        return relax.op.add(relax.op.multiply(bb.emit(relax.op.divide(d, den)), _const((H,), "float32", 2)),
                            _const((H,), "float32", 3))
    mod = _build([("x", (b, s, H), "float32")], body)
    result = compile_ours(mod)
    assert result.report.get("LayerNormFusionPass").effect_times == 1, result.report.get("LayerNormFusionPass").to_dict()
    for sizes in ({"b": 2, "s": 3}, {"b": 1, "s": 9}):
        _compare(mod, result, sizes, "float32")


# --- int8 passes through untouched -------------------------------------------------------------------------

def _int8_graph():
    """conv2d + bias + relu and a matmul chain in int8 (int32 accumulate): shapes our patterns would take
    in float. Everything here must be left to TVM's own lowering."""
    def body(bb, x, w, m):
        c = bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1], out_dtype="int32"))
        c = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(c, relax.const(np.arange(8, dtype="int32")
                                                                         .reshape(1, 8, 1, 1))))))
        y = bb.emit(relax.op.matmul(relax.op.astype(m, "int32"), relax.const(np.ones((6, 6), "int32"))))
        return relax.Tuple([c, relax.op.nn.relu(bb.emit(relax.op.add(y, relax.const(np.ones(6, "int32")))))])
    return _build([("x", (1, 4, 6, 6), "int8"), ("w", (8, 4, 3, 3), "int8"), ("m", (3, 6), "int8")], body)


def test_int8_passes_through_untouched():
    mod = _int8_graph()
    result = compile_ours(mod)
    rng = np.random.default_rng(0)
    inputs = [rng.integers(-8, 8, [int(d) for d in p.ty.shape]).astype("int8") for p in mod["main"].params]
    for a, b in zip(run_vm(result.executable, inputs), run_reference(mod, inputs)):
        np.testing.assert_array_equal(a, b)      # integers: exact
    report = result.report.to_dict()
    for cat in ("graph_fusion", "ub_fusion"):
        for name, rec in report.get(cat, {}).items():
            if name == "CostBasedFusionPass":
                continue     # groups legalized int ops like TVM's FuseOps would; checked below
            assert rec["effect_times"] == 0, (name, rec)
    assert not any(k.get("pattern") for k in report["kernels"]), report["kernels"]
    # no pattern group was formed, so no Composite function reached FuseTIR
    assert "Composite" not in result.fused_module.script(show_meta=False)
