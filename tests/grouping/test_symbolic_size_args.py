"""A group whose kernel takes a symbolic size as a scalar argument: attention over a KV cache of symbolic
length ``n`` (``concat(cache, new)`` has length ``n + 1``). The legalized ``probs @ V`` reduces over ``n + 1``,
which no buffer shape defines, so its PrimFunc takes ``n`` as a scalar (``call_tir(matmul, (p, v, n))``).

Grouped with the reshape after it, the group once got a fresh scalar parameter for ``n`` while its tensor
parameters' shapes kept the caller's ``n``: the fused kernel read an ``n`` nobody passed ("variables (n,) are
used, but are not passed in as API arguments") and the build failed. The group now defines the caller's
``n`` with an ``R.Shape`` parameter, as TVM's FuseOps does; numbers checked against numpy at several lengths.
"""

import numpy as np
import pytest
from tvm import relax, tirx

from tests.helpers import assert_close, compile_ours, run_vm

HEADS, DIM = 4, 16


def _cache_attention():
    n = tirx.Var("n", "int64")
    q = relax.Var("q", relax.TensorType((1, HEADS, 1, DIM), "float32"))
    cache = relax.Var("cache", relax.TensorType((1, HEADS, n, DIM), "float32"))
    new = relax.Var("new", relax.TensorType((1, HEADS, 1, DIM), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, cache, new]):
        with bb.dataflow():
            kv = bb.emit(relax.op.concat([cache, new], axis=2))                      # (1, H, n + 1, D)
            scores = bb.emit(relax.op.matmul(q, relax.op.permute_dims(kv, [0, 1, 3, 2])))
            probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
            ctx = bb.emit(relax.op.matmul(probs, kv))                                # reduces over n + 1
            out = bb.emit_output(relax.op.reshape(relax.op.permute_dims(ctx, [0, 2, 1, 3]), (1, 1, HEADS * DIM)))
        bb.emit_func_output(out)
    return bb.get()


def _numpy(q, cache, new):
    kv = np.concatenate([cache, new], axis=2)
    s = q @ kv.transpose(0, 1, 3, 2)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ kv).transpose(0, 2, 1, 3).reshape(1, 1, HEADS * DIM)


@pytest.fixture(scope="module")
def built():
    return compile_ours(_cache_attention())


@pytest.mark.parametrize("length", [1, 7, 33])
def test_cache_lengths_match_numpy(built, length):
    rng = np.random.default_rng(length)
    args = [rng.standard_normal(s).astype("float32") for s in
            [(1, HEADS, 1, DIM), (1, HEADS, length, DIM), (1, HEADS, 1, DIM)]]
    assert_close(run_vm(built.executable, args), _numpy(*args), rtol=0, atol=1e-5)


def test_size_argument_is_the_callers_var(built):
    """Every kernel taking a scalar reads the caller's ``n``: the group's function defines it by an R.Shape
    parameter instead of taking a scalar of its own."""
    groups = [f for f in built.fused_module.functions.values()
              if isinstance(f, relax.Function) and f.attrs and "Primitive" in f.attrs]
    for f in groups:
        for p in f.params:
            assert isinstance(p.ty, (relax.TensorType, relax.ShapeType)), (p.name, p.ty)


def _signature_dim_only():
    """``broadcast_to(c, (n, 8)) -> exp -> + bias``: the group's only tensor inputs are constants, so no input
    shape defines ``n``; the function's parameter ``x`` does (a decode step's mask and positions over the
    cache length are built this way)."""
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 8), "float32"))
    rng = np.random.default_rng(0)
    c = relax.const(rng.standard_normal((1, 8)).astype("float32"))
    bias = relax.const(rng.standard_normal((8,)).astype("float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            b = bb.emit(relax.op.broadcast_to(c, relax.ShapeExpr([n, 8])))
            e = bb.emit(relax.op.add(relax.op.exp(b), bias))
            out = bb.emit_output(relax.Tuple([e, relax.op.multiply(x, relax.const(2.0, "float32"))]))
        bb.emit_func_output(out)
    return bb.get(), c.value.numpy(), bias.value.numpy()


def test_dims_of_the_signature_are_passed_to_a_group():
    """The broadcast, exp and add are one kernel (the group is passed ``n`` as a size argument; it was refused
    as 'defined by no input of the group' and each op was a kernel of its own), with numpy's numbers."""
    mod, c, bias = _signature_dim_only()
    built = compile_ours(mod)
    [kernel] = [k for k in built.report.kernels if any("broadcast_to" in o for o in k["ops"])]
    assert any("exp" in o for o in kernel["ops"]) and any("add" in o for o in kernel["ops"]), kernel["ops"]
    for length in (1, 5):
        x = np.random.default_rng(length).standard_normal((length, 8)).astype("float32")
        got = run_vm(built.executable, [x])
        assert_close(got[0], np.broadcast_to(np.exp(c) + bias, (length, 8)), rtol=1e-6, atol=1e-6)
        assert_close(got[1], 2 * x, rtol=0, atol=0)
