"""flash_decode.py: the flash-decoding kernel's math (TE, built as it is, libm's exp) against numpy: key counts
around the chunk size, a mask per query head read through the stacked grouped-query rows, keys scored -inf
over a whole chunk."""

import numpy as np
import pytest
import tvm
from tvm import te, tirx

from tests.helpers import assert_close
from tvm_ascendfuse.flash_decode import CHUNK, ScoreSpace, flash_decode

KV, GROUP, ROWS, D = 2, 2, 2, 8          # 4 query heads over 2 KV heads, 2 query rows each: 4 stacked rows


def _kernel(stacked: bool):
    n = tirx.Var("n", "int64")
    m = GROUP * ROWS
    q = te.placeholder((1, KV, m, D), "float32", "q")
    k = te.placeholder((1, KV, n, D), "float32", "k")
    v = te.placeholder((1, KV, n, D), "float32", "v")
    shape = (1, KV, m, n) if stacked else (1, KV * GROUP, ROWS, n)
    mask = te.placeholder(shape, "float32", "mask")
    out = flash_decode(q, k, v, mask, chain=(("multiply", 0.5), ("add", 0)),
                       space=ScoreSpace(GROUP, ROWS, stacked=stacked))
    return tvm.compile(te.create_prim_func([q, k, v, mask, out]), target="llvm")


def _reference(q, k, v, mask, stacked):
    s = q.astype("float64") @ np.swapaxes(k, -1, -2) * 0.5
    if not stacked:                      # (1, heads, rows, n) -> the stacked (1, kv, group * rows, n)
        mask = mask.reshape(1, KV, GROUP * ROWS, -1)
    s = s + mask
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(-1, keepdims=True))
    p = np.where(np.isneginf(s), 0.0, p)
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("stacked", [True, False])
def test_math_agrees_around_the_chunk_size(stacked):
    lib = _kernel(stacked)
    rng = np.random.default_rng(0)
    for n in (1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 3):
        q = rng.standard_normal((1, KV, GROUP * ROWS, D)).astype("float32")
        k, v = (rng.standard_normal((1, KV, n, D)).astype("float32") for _ in range(2))
        shape = (1, KV, GROUP * ROWS, n) if stacked else (1, KV * GROUP, ROWS, n)
        mask = np.where(rng.random(shape) < 0.3, np.finfo(np.float32).min, 0.0).astype("float32")
        out = tvm.runtime.tensor(np.zeros((1, KV, GROUP * ROWS, D), "float32"))
        lib(*[tvm.runtime.tensor(a) for a in (q, k, v, mask)], out)
        assert_close(out.numpy(), _reference(q, k, v, mask, stacked), rtol=1e-4, atol=1e-5)


def test_a_chunk_scored_minus_infinity_weighs_nothing():
    lib = _kernel(True)
    rng = np.random.default_rng(1)
    n = 2 * CHUNK + 9
    q = rng.standard_normal((1, KV, GROUP * ROWS, D)).astype("float32")
    k, v = (rng.standard_normal((1, KV, n, D)).astype("float32") for _ in range(2))
    mask = np.zeros((1, KV, GROUP * ROWS, n), "float32")
    mask[..., CHUNK:2 * CHUNK] = -np.inf
    out = tvm.runtime.tensor(np.zeros((1, KV, GROUP * ROWS, D), "float32"))
    lib(*[tvm.runtime.tensor(a) for a in (q, k, v, mask)], out)
    assert np.isfinite(out.numpy()).all()
    assert_close(out.numpy(), _reference(q, k, v, mask, True), rtol=1e-4, atol=1e-5)
