"""Vectorisable exp / erf / sigmoid for scheduled kernels.

On the llvm host ``T.exp`` and ``T.erf`` compile to one scalar libm call per element even inside a
vectorised loop (field guide §10, K2), which makes softmax, GELU and SiLU kernels 10-50x slower than the
memory traffic allows. The NPU's vector unit has its own exp/erf; on the host we substitute polynomial
forms built from plain arithmetic, which LLVM vectorises:

* exp: range reduction ``x = n ln2 + r`` with ``n = floor(x log2 e + 1/2)``, a degree-7 polynomial for
  ``e^r`` (Cephes coefficients) and ``2^n`` built in the exponent bits; relative error ~1e-7 on
  [-87.3, 88.7]; below ln(FLT_MIN) the result is 0 (no denormals: masked scores stay fast).
* erf: the odd rational approximation used by Eigen/XLA on [-4, 4] (|error| < 1e-6 in float32).
* sigmoid: ``1 / (1 + exp(-x))`` with the exp above.

The rewrite works on TIR (after FuseTIR) so it reaches every fused kernel whatever grouped it; float16 is
computed in float32 and cast back; bfloat16 is left to libm (see ``_rewrite_call``).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
             5.0000001201e-1)
_ERF_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
              -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
             -1.42647390514189e-02)


def _f32(v: float):
    return tirx.const(v, "float32")


def _horner(x, coeffs):
    acc = _f32(coeffs[0])
    for c in coeffs[1:]:
        acc = acc * x + _f32(c)
    return acc


def _let(value, body_fn, name):
    var = tirx.Var(name, "float32")
    return tirx.Let(var, value, body_fn(var))


def fast_exp_expr(x):
    """float32 exp(x) from arithmetic only."""
    def body(xc):
        def with_n(n):
            def with_r(r):
                poly = _horner(r, _EXP_POLY) * r * r + r + _f32(1.0)
                bits = tirx.shift_left(tirx.Cast("int32", n + _f32(127.0)), tirx.const(23, "int32"))
                return tirx.reinterpret("float32", bits) * poly
            return _let(xc - n * _f32(0.693359375) - n * _f32(-2.12194440e-4), with_r, "exp_r")
        return _let(tirx.floor(xc * _f32(1.44269504088896341) + _f32(0.5)), with_n, "exp_n")
    def flush(xv):
        # Below ln(FLT_MIN) the result would be denormal (masked attention scores): denormal arithmetic
        # downstream is ~100x slower on x86, and the true value rounds to 0 anyway (|err| < 1.2e-38).
        clamped = tirx.max(tirx.min(xv, _f32(88.3762626647949)), _f32(-87.3365447505531))
        return tirx.Select(xv < _f32(-87.3365447505531), _f32(0.0), _let(clamped, body, "exp_x"))
    return _let(x, flush, "exp_in")


def fast_erf_expr(x):
    """float32 erf(x): odd rational approximation on [-4, 4] (erf is +-1 to float precision outside)."""
    def body(xc):
        def with_x2(x2):
            return xc * _horner(x2, _ERF_ALPHA) / _horner(x2, _ERF_BETA)
        return _let(xc * xc, with_x2, "erf_x2")
    return _let(tirx.max(tirx.min(x, _f32(4.0)), _f32(-4.0)), body, "erf_x")


def fast_sigmoid_expr(x):
    return _f32(1.0) / (_f32(1.0) + fast_exp_expr(_f32(0.0) - x))


_REWRITES = {"tirx.exp": fast_exp_expr, "tirx.erf": fast_erf_expr, "tirx.sigmoid": fast_sigmoid_expr}


def _rewrite_call(call):
    op = call.op
    if not isinstance(op, tvm.ir.Op) or op.name not in _REWRITES:
        return call
    ty = call.ty
    if not isinstance(ty, tvm.ir.PrimType):
        return call
    dtype = str(ty.dtype)
    if dtype not in ("float32", "float16"):
        # bfloat16 is emulated on the host: TVM's BF16 legalization expands the final f32->bf16 cast into
        # rounding bit arithmetic that repeats its operand, duplicating our Let bindings (same var bound
        # twice), which gave wrong sigmoid values (|err| ~0.9) or a vectorizer abort. Keep libm there.
        return call
    arg = call.args[0]
    if dtype != "float32":
        arg = tirx.Cast("float32", arg)
    out = _REWRITES[op.name](arg)
    return out if dtype == "float32" else tirx.Cast(dtype, out)


def use_fast_math(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """The same PrimFunc with exp/erf/sigmoid replaced by their vectorisable polynomial forms."""
    found = []
    tvm_ffi.structural_walk(func, (tvm.ir.expr.Call, lambda c: found.append(c) if isinstance(c.op, tvm.ir.Op)
                                   and c.op.name in _REWRITES else None))
    if not found or _has_bfloat16(func):
        # a bfloat16 buffer: TVM's BF16 legalization expands every f32 -> bf16 cast into rounding arithmetic
        # that repeats its operand, so a polynomial (its Let bindings) computed in float32 and stored as bf16
        # (a bf16 model computed in float32, precision/compute_fp32.py) gets the same var bound twice: wrong
        # values or a build error. libm's calls have no Lets.
        return func
    return tvm_ffi.structural_map(func, (tvm.ir.expr.Call, _rewrite_call))


def _has_bfloat16(func: tirx.PrimFunc) -> bool:
    return any(isinstance(p.ty, tirx.BufferType) and str(p.ty.dtype) == "bfloat16" for p in func.params)
