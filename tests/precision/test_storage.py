"""SixteenBitStoragePass: tensors between kernels in 16 bits, kernels computing in float32, numbers checked
against float32 numpy by the output's scale and cosine."""

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import tirx as T

import tvm_ascendfuse as af
from tvm_ascendfuse.precision import storage
from tvm_ascendfuse.precision.round_weights import round_to
from tests.helpers import run_vm


def _block(dtype="float32", seed=0):
    """matmul -> relu -> matmul -> softmax -> matmul: kernels of three rules, tensors between them."""
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((64, 64)) / 8).astype(dtype) for _ in range(3)]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((32, 64), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = relax.op.nn.relu(relax.op.matmul(x, relax.const(ws[0])))
            p = relax.op.nn.softmax(relax.op.matmul(h, relax.const(ws[1])))
            out = bb.emit_output(relax.op.matmul(p, relax.const(ws[2])))
        bb.emit_func_output(out)
    return bb.get(), [w.astype("float32") for w in ws]


def _rows_block(dtype="float16", seed=0):
    """softmax(x W0 + relu(x W1) W2): the GEMM writing the softmax's input is read by vector loads (stored
    in 16 bits); the tensors GEMMs read as their left operand are stored as float32 holding 16-bit values."""
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((64, 64)) / 8).astype(dtype) for _ in range(3)]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 64), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = [relax.const(w) for w in ws]
            inner = relax.op.matmul(relax.op.nn.relu(relax.op.matmul(x, c[1])), c[2])
            out = bb.emit_output(relax.op.nn.softmax(relax.op.add(relax.op.matmul(x, c[0]), inner)))
        bb.emit_func_output(out)
    return bb.get(), [w.astype("float32") for w in ws]


def _rows_reference(x, ws, r=lambda a: a):
    h = r(np.maximum(x @ ws[1], 0))
    t = x @ ws[0] + h @ ws[2]
    e = np.exp(t - t.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _carries_16bit(report, dtype):
    """(kernels writing dtype, kernels writing float32 holding dtype values) over the intermediate tensors."""
    rows = [k["precision"] for k in report.kernels]
    stored = [p for p in rows if p["output"] == dtype]
    rounded = [p for p in rows if p.get("output_rounded_to") == dtype]
    return stored, rounded


def _reference(x, ws, rounding=None):
    """float32 numpy; ``rounding`` applied where the build stores a tensor between kernels."""
    r = rounding or (lambda a: a)
    h = r(np.maximum(x @ ws[0], 0))
    s = h @ ws[1]
    e = np.exp(s - s.max(-1, keepdims=True))
    return r(e / e.sum(-1, keepdims=True)) @ ws[2]


def _cosine(a, b):
    a, b = a.astype("float64").ravel(), b.astype("float64").ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _intermediate_dtypes(mod):
    out = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and b.value.op.name == "relax.call_tir":
                out.append(str(b.var.ty.dtype))
    return out


def test_fp16_model_stores_fp16_between_kernels():
    mod, ws = _rows_block("float16")
    res = af.compile_model(mod, portable=True)
    dtypes = _intermediate_dtypes(res.scheduled_module)
    assert "float16" in dtypes[:-1], dtypes                   # a tensor between kernels in 16 bits
    section = res.report.sections["precision"]
    assert section["dtype"] == "float16" and section["mode"] == "must_keep_origin_dtype"
    # every launched kernel has a report row with its GM dtypes
    rows = {k["name"]: k for k in res.report.kernels}
    launched = [b.value.args[0].name_hint for block in res.scheduled_module["main"].body.blocks
                for b in block.bindings if isinstance(b.value, relax.Call) and b.value.op.name == "relax.call_tir"]
    assert set(launched) <= set(rows)
    stored, rounded = _carries_16bit(res.report, "float16")
    assert stored and rounded
    # every other tensor between kernels is a float32 buffer holding fp16 values (read one element at a time)
    x = np.random.default_rng(1).standard_normal((64, 64)).astype("float16")
    got = run_vm(res.executable, [x]).astype("float32")
    want = _rows_reference(x.astype("float32"), ws)
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()
    assert _cosine(got, want) >= 0.9999


def test_kernels_convert_in_their_vector_loops():
    """The 16-bit loads sit in the rules' vectorised loops (one vector conversion, not a scalar loop)."""
    import tvm_ffi

    mod, _ = _rows_block("float16")
    res = af.compile_model(mod, portable=True)
    found = {}

    def on_for(loop):
        if loop.kind != tirx.ForKind.VECTORIZED:
            return

        def on_load(load):
            if str(load.source.ty.dtype) == "float16":
                found[name] = True

        tvm_ffi.structural_walk(loop.body, (tvm.ir.TensorLoad, on_load))

    for gv, f in res.scheduled_module.functions.items():
        if isinstance(f, tirx.PrimFunc) and any(str(p.ty.dtype) == "float16" for p in f.params):
            name = gv.name_hint
            tvm_ffi.structural_walk(f.body, (tirx.For, on_for))
    assert found, "no 16-bit load inside a vectorised loop"


@pytest.mark.parametrize("mode,dtype,min_cos", [("force_fp16", "float16", 0.9995), ("force_bf16", "bfloat16", 0.995),
                                                ("allow_mix_precision", "float16", 0.9995)])
def test_float32_model_under_a_16bit_mode(mode, dtype, min_cos):
    mod, ws = _block("float32")
    res = af.compile_model(mod, portable=True, precision_mode=mode)
    dtypes = _intermediate_dtypes(res.scheduled_module)
    assert dtypes[-1] == "float32"                       # the model's output keeps its dtype
    stored, rounded = _carries_16bit(res.report, dtype)
    assert stored or rounded
    x = np.random.default_rng(2).standard_normal((32, 64)).astype("float32")
    got = run_vm(res.executable, [x])
    rounded = [round_to(w, dtype) for w in ws]
    want = _reference(x, ws)
    assert _cosine(got, want) >= min_cos
    # closer to the computation with the NPU's 16-bit weights and tensors than the float32 one is
    want16 = _reference(x, rounded, lambda a: round_to(a, dtype))
    assert np.abs(got - want16).max() <= 2e-2 * np.abs(want16).max()
    traffic = res.report.sections["traffic"]
    assert traffic["gm_storage_dtype"] == dtype


def test_mixed_precision_keeps_norm_output_fp32():
    """A post-norm block: the kernel ending in LayerNorm writes float32 under allow_mix_precision, fp16 under
    force_fp16; both agree with the float32 build."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((32, 64), "float32"))
    w = relax.const((rng.standard_normal((64, 64)) / 8).astype("float32"))
    gamma, beta = relax.const(np.ones(64, "float32")), relax.const(np.zeros(64, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = relax.op.add(x, relax.op.nn.gelu(relax.op.matmul(x, w)))
            n = relax.op.nn.layer_norm(h, gamma, beta, axes=[-1])
            out = bb.emit_output(relax.op.add(n, relax.op.nn.gelu(relax.op.matmul(n, w))))
        bb.emit_func_output(out)
    mod = bb.get()
    mixed = af.compile_model(mod, portable=True, precision_mode="allow_mix_precision")
    forced = af.compile_model(mod, portable=True, precision_mode="force_fp16")
    kept = mixed.report.sections["precision"]["kept_fp32"]
    assert kept and all("layer_norm" in k["op"] for k in kept), [k.get("ops") for k in mixed.report.kernels]
    assert not forced.report.sections["precision"]["kept_fp32"]
    kept_kernels = {k["kernel"] for k in kept}
    # the norm kernel's output: neither stored in fp16 nor rounded under mixed precision; under force_fp16 it is
    for res, carries in ((mixed, False), (forced, True)):
        rows = [r for r in res.report.kernels if r.get("source_kernel", r["name"]) in kept_kernels]
        assert rows and all((r["precision"]["output"] == "float16"
                             or r["precision"].get("output_rounded_to") == "float16") == carries for r in rows)
    x = rng.standard_normal((32, 64)).astype("float32")
    ref = run_vm(af.compile_model(mod, portable=True).executable, [x])
    for res in (mixed, forced):
        assert _cosine(run_vm(res.executable, [x]), ref) >= 0.9995


def test_keep_list_reads_the_kernels_last_op():
    from tvm_ascendfuse.precision.modes import keeps_fp32

    assert keeps_fp32(["matmul", "add", "layer_norm"]) == "layer_norm"
    assert keeps_fp32(["mean", "reshape"]) == "mean"              # layout ops keep their input's dtype
    assert keeps_fp32(["matmul", "softmax", "matmul"]) is None     # the softmax never reaches GM
    assert keeps_fp32(["max_pool2d"]) is None


def test_float32_build_unchanged():
    mod, _ = _block("float32")
    res = af.compile_model(mod, portable=True)
    assert "precision" not in res.report.sections
    assert all(d == "float32" for d in _intermediate_dtypes(res.scheduled_module))
    assert "gm_storage_dtype" not in res.report.sections["traffic"]


@T.prim_func(private=True)
def _accumulates_in_output(a: T.Buffer((8, 8), "float32"), out: T.Buffer((8,), "float32")):
    for i, j in T.grid(8, 8):
        if j == 0:
            out[i] = T.float32(0)
        out[i] = out[i] + a[i, j]


@T.prim_func(private=True)
def _plain(a: T.Buffer((8, 8), "float32"), out: T.Buffer((8,), "float32")):
    for i in range(8):
        out[i] = a[i, 0] * T.float32(2)


def test_output_read_back_stays_float32():
    f = _accumulates_in_output
    assert not storage._convertible(f, f.params[1], output=True)       # would accumulate in 16 bits
    assert storage._convertible(f, f.params[0], output=False)
    g = _plain
    assert storage._convertible(g, g.params[1], output=True)


def test_store_sixteen_bit_rewrites_loads_and_stores():
    g = _plain
    new = storage._store_sixteen_bit(g, [g.params[0], g.params[1]], "float16")
    assert [str(p.ty.dtype) for p in new.params] == ["float16", "float16"]
    ex = tvm.compile(tvm.IRModule({"main": new.with_attr("global_symbol", "main")}), target="llvm")
    a = np.random.default_rng(0).standard_normal((8, 8)).astype("float16")
    out = tvm.runtime.tensor(np.zeros(8, "float16"))
    ex["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy(), (a[:, 0].astype("float32") * 2).astype("float16"))


@T.prim_func(private=True, s_tir=True)
def _stores_through_view(a: T.Buffer((4, 8), "float32"), out: T.Buffer((4, 8), "float32")):
    for i in range(4):
        with T.sblock("store"):
            vi = T.axis.spatial(4, i)
            T.reads(a[vi, 0:8])
            T.writes(out[vi, 0:8])
            view = T.match_buffer(out[vi, 0:8], (8,), offset_factor=1)
            for j in range(8):
                view[j] = a[vi, 7 - j] * T.float32(2)


@T.prim_func(private=True, s_tir=True)
def _reads_view_back(a: T.Buffer((4, 8), "float32"), out: T.Buffer((4, 8), "float32")):
    for i in range(4):
        with T.sblock("store"):
            vi = T.axis.spatial(4, i)
            T.reads(a[vi, 0:8], out[vi, 0:8])
            T.writes(out[vi, 0:8])
            view = T.match_buffer(out[vi, 0:8], (8,), offset_factor=1)
            for j in range(8):
                view[j] = view[j] + a[vi, j]


def test_output_stored_through_a_view_is_sixteen_bit():
    """An output whose tiles are stored through a matched view (the conv rule's transposed stores) is held in
    16 bits with its view; a view read back (accumulating) keeps it float32; a reader's view too."""
    f = _stores_through_view
    assert storage._convertible(f, f.params[1], output=True)
    assert not storage._convertible(f, f.params[1], output=False)
    g = _reads_view_back
    assert not storage._convertible(g, g.params[1], output=True)
    new = storage._store_sixteen_bit(f, [f.params[1]], "float16")
    assert [str(p.ty.dtype) for p in new.params] == ["float32", "float16"]
    ex = tvm.compile(tvm.IRModule({"main": new.with_attr("global_symbol", "main")}), target="llvm")
    a = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((4, 8), "float16"))
    ex["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy(), (a[:, ::-1] * 2).astype("float16"))


@T.prim_func(private=True, s_tir=True)
def _let_in_vector_store(a: T.Buffer((4, 16), "float32"), out: T.Buffer((4, 16), "float32")):
    for i in range(4):
        for j in T.vectorized(16):
            with T.sblock("gelu_like"):
                vi, vj = T.axis.remap("SS", [i, j])
                x = T.float32()
                out[vi, vj] = T.Let(x * x + x, where={x: a[vi, vj] * T.float32(0.5)})


def test_bfloat16_store_of_a_let_vectorizes():
    """A vector store whose value holds a ``let`` (GELU's erf argument) stored in bfloat16: TVM's bf16
    legalization reads the rounded value twice, which with the ``let`` stopped the loop vectorizer."""
    import ml_dtypes

    f = _let_in_vector_store
    new = storage._store_sixteen_bit(f, [f.params[1]], "bfloat16")
    ex = tvm.compile(tvm.IRModule({"main": new.with_attr("global_symbol", "main")}), target="llvm")
    a = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((4, 16), ml_dtypes.bfloat16))
    ex["main"](tvm.runtime.tensor(a), out)
    x = a * 0.5
    want = (x * x + x).astype(ml_dtypes.bfloat16).astype("float32")
    np.testing.assert_allclose(out.numpy().astype("float32"), want, rtol=2 ** -8, atol=1e-6)


def _host_has_f16c() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " f16c" in f.read()
    except OSError:
        return False


@pytest.mark.skipif(not _host_has_f16c(), reason="the host has no F16C conversions")
def test_host_build_converts_with_vector_instructions():
    """Built for this CPU, the 16-bit loads and stores of the kernels are F16C (or, on a CPU with AVX512-FP16,
    its ``x``-suffixed) conversions of whole vectors,
    not calls of the scalar conversion helpers."""
    import re

    mod, _ = _rows_block("float16")
    res = af.compile_model(mod, portable=False)
    checked, seen = 0, {}
    for gv, f in res.scheduled_module.functions.items():
        if isinstance(f, tirx.PrimFunc) and any(str(p.ty.dtype) == "float16" for p in f.params):
            lib = tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target=res.host_target)
            asm = lib.mod.inspect_source("asm")
            loads = bool(re.search(r"vcvtph2psx?\s+[^\n]*[yz]mm", asm))
            stores = bool(re.search(r"vcvtps2phx?\s+[^\n]*[yz]mm", asm))
            assert loads or stores, gv.name_hint
            assert not re.search(r"call\s+[^\n]*(__extendhfsf2|__truncsfhf2)", asm), gv.name_hint
            checked += 1
            seen.update({"loads": loads, "stores": stores} if not seen else
                        {"loads": seen["loads"] or loads, "stores": seen["stores"] or stores})
    assert checked and seen["loads"] and seen["stores"]


def test_kernel_with_two_outputs_reads_fp16():
    """A kernel with two outputs (left in float32) whose input is stored in fp16 is rebuilt with its tuple of
    result types (the LLaMA decoder's RoPE kernel)."""
    rng = np.random.default_rng(0)
    w = relax.const((rng.standard_normal((64, 64)) / 8).astype("float32"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((32, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(relax.op.matmul(x, w)))
            parts = bb.emit(relax.op.split(h, 2, axis=1))
            a = relax.op.exp(relax.TupleGetItem(parts, 0))
            b = relax.op.sigmoid(relax.TupleGetItem(parts, 1))
            w2 = relax.const((rng.standard_normal((32, 64)) / 8).astype("float32"))
            out = bb.emit_output(relax.op.concat([relax.op.matmul(a, w2), relax.op.matmul(b, w2)], axis=1))
        bb.emit_func_output(out)
    mod = bb.get()
    res = af.compile_model(mod, portable=True, precision_mode="force_fp16")
    xv = rng.standard_normal((32, 64)).astype("float32")
    ref = run_vm(af.compile_model(mod, portable=True).executable, [xv])
    assert _cosine(run_vm(res.executable, [xv]), ref) >= 0.999


@T.prim_func(private=True)
def _broadcast_and_vector(a: T.Buffer((8, 16), "float32"), b: T.Buffer((8, 16), "float32"),
                          out: T.Buffer((8, 16), "float32")):
    for i in range(8):
        for j in T.vectorized(16):
            out[i, j] = a[i, 0] * b[i, j]        # a: one element broadcast per row; b: a 16-lane load


def test_loads_are_vectors():
    f = _broadcast_and_vector
    assert storage.loads_are_vectors(f, f.params[1])
    assert not storage.loads_are_vectors(f, f.params[0])
    assert storage.loads_are_vectors(_plain, _plain.params[0])     # nothing vectorised: no vector path to slow
