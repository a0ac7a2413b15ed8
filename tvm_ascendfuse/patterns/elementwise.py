"""Chains of elementwise ops (TbeEltwiseFusionPass): each value stays in UB for the next op.

Deliberately simple: chains of two to four injective ops, lowest priority so every anchored family
(conv, matmul, norms, ...) takes its epilogue first. TVM's FuseOps groups whatever is left.
"""

from __future__ import annotations

from tvm.relax.dpl import is_op, wildcard

from ..switches import TBE_ELTWISE as SWITCH
from .checks import float_dtypes, known_shapes, private_intermediates
from .registry import PatternSpec, declare
from .working_set import elementwise_working_set


UNARY = ("relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.exp", "relax.negative", "relax.sqrt",
         "relax.rsqrt", "relax.abs", "relax.erf", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu",
         "relax.nn.leakyrelu", "relax.log", "relax.square")
COMMUTATIVE = ("relax.add", "relax.multiply")          # the matcher tries both argument orders itself
BINARY = ("relax.subtract", "relax.divide", "relax.maximum", "relax.minimum", "relax.power")


def step(x):
    """One elementwise op with ``x`` as (one of) its inputs."""
    pat = is_op("relax.clip")(x, wildcard(), wildcard())
    for op in UNARY:
        pat = pat | is_op(op)(x)
    for op in COMMUTATIVE:
        pat = pat | is_op(op)(x, wildcard())
    for op in BINARY:
        pat = pat | is_op(op)(x, wildcard()) | is_op(op)(wildcard(), x)
    return pat


def chain(n: int):
    pat = wildcard()
    for _ in range(n):
        pat = step(pat)
    return pat


def _declare_all() -> None:
    for n in (2, 3, 4):
        declare(PatternSpec(name=f"ascendfuse.elementwise.chain{n}", switch=SWITCH, pattern=chain(n),
                            checks=(float_dtypes, known_shapes, private_intermediates),
                            working_set=elementwise_working_set, priority=10 + n,
                            description=f"{n} elementwise ops in a row"))


_declare_all()
