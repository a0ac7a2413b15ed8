"""A whole recurrent layer as Relax: the input projection GEMM, the weights laid out for the layer kernel
(``recurrence_kernel``) and the kernel's call. Below both frontends: the ONNX converters
(``onnx_recurrent``) and the PyTorch ones (``torch_recurrent``) call ``whole_layer`` with their weights as
their format stores them, naming the order of the gate blocks in them (``GATES``); the reordering into the
kernel's order is a Relax slice + concat, folded at compile time for constant weights like the rest of the
layout.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax import op as _op

from .recurrence_kernel import LayerSpec, layer_kernel, panel_units

# The gate blocks of the kernel's weight rows, in its order, by role. An LSTM: input, output, forget gates and
# the cell candidate; a GRU: update (z), reset (r) and new (n, the candidate); an RNN its one activation.
GATES = {
    "lstm": ("input", "output", "forget", "cell"),
    "gru": ("update", "reset", "new"),
    "gru_lbr0": ("update", "reset", "new"),   # without linear_before_reset: Rb of n adds to the projection
    "rnn": ("hidden",),
}


def _kernel_order(bb, m, kind: str, order: tuple, hidden: int, axis: int):
    """``m`` with its gate blocks (``hidden`` rows each along ``axis``) moved from ``order`` into the
    kernel's order."""
    want = GATES[kind]
    if tuple(order) == want:
        return m
    if sorted(order) != sorted(want):
        raise ValueError(f"gate order {order} does not name the {kind} gates {want}")
    blocks = [bb.emit(_op.strided_slice(m, [axis], [order.index(g) * hidden], [(order.index(g) + 1) * hidden]))
              for g in want]
    return bb.emit(_op.concat(blocks, axis))


def whole_layer(bb, kind: str, x, w, r, wb, rb, h0, c0, dirs: list[str], gate_order: tuple):
    """One layer (one or both directions) as the layer kernel.

    ``x`` (seq, batch, input); ``w`` (dirs, gates x hidden, input) and ``r`` (dirs, gates x hidden,
    hidden), their gate blocks in ``gate_order``; ``wb``, ``rb`` (dirs, gates x hidden) or None (no bias);
    ``h0``, ``c0`` (dirs, batch, hidden) or None (zeros); ``dirs`` ["forward"], ["reverse"] or both.
    -> (Y (seq, dirs, batch, hidden), Y_h (dirs, batch, hidden), the last cell state (dirs, batch, hidden)
    for an LSTM else None)."""
    seq, batch, k_in = (int(d) for d in x.ty.shape)
    dtype = str(x.ty.dtype)
    g, nd = len(GATES[kind]), len(dirs)
    hidden = int(r.ty.shape[2])
    w, r = (_kernel_order(bb, m, kind, gate_order, hidden, 1) for m in (w, r))
    if wb is not None:
        wb, rb = (_kernel_order(bb, m, kind, gate_order, hidden, 1) for m in (wb, rb))
    else:
        wb = rb = relax.const(np.zeros((nd, g * hidden), dtype), dtype)
    spec = LayerSpec(kind, seq, batch, hidden, panel_units(hidden, g, batch), nd, dirs == ["reverse"])
    units, panels = spec.units, spec.panels
    rbh = None
    if kind == "gru":
        # linear_before_reset: Rb of z and r adds to the projection; Rb of n is multiplied by the reset gate
        # (a kernel input)
        rbh = bb.emit(_op.strided_slice(rb, [1], [2 * hidden], [3 * hidden]))
        rb = bb.emit(_op.concat([_op.strided_slice(rb, [1], [0], [2 * hidden]),
                                 relax.const(np.zeros((nd, hidden), dtype), dtype)], 1))
    rows = bb.emit(_op.reshape(x, (seq * batch, k_in)))
    # rows [dir, gate, panel, unit] -> [dir, panel, gate, unit]: the kernel's panel order
    w_rows = bb.emit(_op.reshape(_op.permute_dims(_op.reshape(w, (nd, g, panels, units, k_in)), [0, 2, 1, 3, 4]),
                                 (nd * g * hidden, k_in)))
    bias = bb.emit(_op.reshape(_op.permute_dims(_op.reshape(_op.add(wb, rb), (nd, g, panels, units)),
                                                [0, 2, 1, 3]), (nd * g * hidden,)))
    # kept 2-D, (seq x batch) rows: a reshape to (seq, batch, ...) in its epilogue would make the GEMM
    # rule see batch-1 products of one row each (a GEMV per step, a fifth of the GEMM speed on lstm2)
    proj = bb.emit(_op.add(_op.matmul(rows, bb.emit(_op.permute_dims(w_rows, [1, 0]))), bias))
    # R^T in panels: (dirs, panels, hidden_in, gates x units), each panel one contiguous block
    packed = bb.emit(_op.reshape(_op.permute_dims(_op.reshape(r, (nd, g, panels, units, hidden)), [0, 2, 4, 1, 3]),
                                 (nd, panels, hidden, g * units)))

    def state(init):
        return relax.const(np.zeros((nd, batch, hidden), dtype), dtype) if init is None else init
    gv = bb.add_func(layer_kernel(spec, scheduled=False), f"{kind}_layer")
    y_ty = relax.TensorType((seq, nd, batch, hidden), dtype)
    if kind == "lstm":
        res = bb.emit(relax.call_tir(gv, relax.Tuple([proj, packed, state(h0), state(c0)]),
                                     [y_ty, relax.TensorType((nd, batch, hidden), dtype)]))
        y, y_c = bb.emit(relax.TupleGetItem(res, 0)), bb.emit(relax.TupleGetItem(res, 1))
    else:
        args = [proj, packed] + ([rbh] if rbh is not None else []) + [state(h0)]
        y, y_c = bb.emit(relax.call_tir(gv, relax.Tuple(args), y_ty)), None
    # Y_h: each direction's last step (time seq - 1 forward, 0 reverse)
    last = [bb.emit(_op.strided_slice(y, [0, 1], [seq - 1 if name == "forward" else 0, d],
                                      [seq if name == "forward" else 1, d + 1]))
            for d, name in enumerate(dirs)]
    y_h = bb.emit(_op.reshape(last[0] if nd == 1 else _op.concat(last, 1), (nd, batch, hidden)))
    return y, y_h, y_c
