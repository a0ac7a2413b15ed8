"""Reshape index arithmetic simplified before a rule reads a kernel (``indices.py``): the grouping's capacity
check and the rule's actual allocation agree on an epilogue that reshapes across a tile (an unsimplified
``% rows`` drags every row of the tile column into the epilogue's region; end to end: test_apply's
Swin-T-style epilogue)."""

import tvm_ffi
from tvm import relax, tirx

from tests.schedule.kernels import fused_kernel
from tvm_ascendfuse.schedule.indices import simplify_indices


def _qkv(x, w, b, rows, hidden):
    """torch's multi-head attention in-projection as exported: (L, 1, E) -> linear -> (L, 1, 3E) -> unflatten
    -> unsqueeze -> transpose -> squeeze = (3, L, 1, E)."""
    y = relax.op.expand_dims(relax.op.reshape(relax.op.add(relax.op.matmul(x, w), b), (rows, 1, 3, hidden)), 0)
    return relax.op.squeeze(relax.op.permute_dims(y, [3, 1, 2, 0, 4]), [3])


def _divmods(func):
    found = []
    tvm_ffi.structural_walk(func.body, ((tirx.FloorDiv, tirx.FloorMod), found.append))
    return len(found)


def test_reshape_indices_lose_their_divisions():
    rows, hidden = 13, 16
    func = fused_kernel(lambda x, w, b: _qkv(x, w, b, rows, hidden),
                        [(rows, 1, hidden), (hidden, 3 * hidden), (3 * hidden,)])
    simpler = simplify_indices(func)
    assert _divmods(simpler) < _divmods(func)
    assert simplify_indices(simpler) is simpler          # nothing left to simplify: the same function
