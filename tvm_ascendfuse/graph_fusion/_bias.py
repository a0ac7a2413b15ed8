"""Walking a chain of constant adds/subtracts down to the op that produces it (shared by the bias passes)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._graph import FunctionGraph, op_name, static_shape


@dataclass
class BiasChain:
    producer: object                 # the variable bound to the producing op (conv2d / matmul)
    total: np.ndarray                # the summed constant, float64, as broadcast onto the output
    steps: int                       # number of add/subtract bindings in the chain
    internal: set = field(default_factory=set)
    first_const: object = None       # the constant operand of the root binding (for the canonical check)
    producer_first: bool = True      # the root binding is add(producer-side, const)


def bias_chain(graph: FunctionGraph, root, producer_ops: tuple, fits) -> BiasChain | None:
    """``root = producer (+|-) c1 (+|-) c2 ...`` through single-use intermediates.

    ``fits(array, out_shape)`` says whether a constant is a bias of this producer (varies only along the
    channel axis); a constant that is not stops the walk (the chain is then not a bias chain).
    """
    out_shape = static_shape(root)
    if out_shape is None:
        return None
    total, steps, internal, cur = None, 0, set(), root
    first_const, producer_first = None, True
    while True:
        val = graph.value(cur)
        name = op_name(val)
        if name == "relax.add":
            if graph.const(val.args[1]) is not None:
                other, const, sign, const_first = val.args[0], val.args[1], 1.0, False
            elif graph.const(val.args[0]) is not None:
                other, const, sign, const_first = val.args[1], val.args[0], 1.0, True
            else:
                return None
        elif name == "relax.subtract" and graph.const(val.args[1]) is not None:
            other, const, sign, const_first = val.args[0], val.args[1], -1.0, False
        else:
            return None
        arr = graph.const(const)
        if arr.ndim > len(out_shape) or not fits(arr, out_shape):
            return None
        term = sign * np.broadcast_to(arr.astype("float64"), _bias_shape(arr, out_shape))
        total = term if total is None else total + term
        if steps == 0:
            first_const, producer_first = (const if sign > 0 else None), not const_first
        else:
            internal.add(cur)
        steps += 1
        if op_name(graph.value(other)) in producer_ops:
            return BiasChain(other, total, steps, internal, first_const, producer_first)
        if not graph.single_use(other):
            return None
        cur = other


def _bias_shape(arr: np.ndarray, out_shape: tuple) -> tuple:
    padded = (1,) * (len(out_shape) - arr.ndim) + tuple(arr.shape)
    return tuple(max(a, 1) for a in padded)
