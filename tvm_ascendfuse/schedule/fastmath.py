"""Replace ``T.erf`` in a PrimFunc by a rational polynomial that vectorises.

LLVM lowers ``T.erf`` to a scalar ``erff`` libcall even inside a vectorised loop, so an erf-GELU epilogue
costs more than the GEMM it follows. The polynomial (odd degree 13 over even degree 8, input clamped to
[-4, 4]) is the classic single-precision approximation, max abs error ~4e-7 against ``math.erf``; it is
evaluated in float32 (float16 inputs are widened and narrowed back).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

_ERF = tvm.ir.Op.get("tirx.erf")
_NUM = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
        -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_DEN = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
        -1.42647390514189e-02)


def erf_polynomial(x: tirx.Expr) -> tirx.Expr:
    dtype = str(x.ty.dtype)
    xf = x if dtype == "float32" else tirx.Cast("float32", x)
    f = lambda v: tirx.FloatImm("float32", v)  # noqa: E731
    xc = tirx.Max(tirx.Min(xf, f(4.0)), f(-4.0))
    x2 = xc * xc
    p = f(_NUM[0])
    for c in _NUM[1:]:
        p = x2 * p + f(c)
    q = f(_DEN[0])
    for c in _DEN[1:]:
        q = x2 * q + f(c)
    r = xc * p / q
    return r if dtype == "float32" else tirx.Cast(dtype, r)


def fast_erf(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every float ``erf`` call replaced by the polynomial (other calls untouched)."""

    def on_call(call):
        if call.op.same_as(_ERF) and str(call.ty.dtype) in ("float32", "float16"):
            return erf_polynomial(call.args[0])
        return call

    return tvm_ffi.structural_map(func, (tvm.ir.Call, on_call))
