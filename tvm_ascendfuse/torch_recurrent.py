"""PyTorch's ``aten.lstm`` / ``aten.gru`` / ``aten.rnn_tanh`` (``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` as
``torch.export`` gives them) as one layer kernel per layer (``recurrent_layer``, the kernel the ONNX
converters build).

TVM's translations unroll the steps (each step its own kernels) and take one layer only; this converter
takes every layer, both directions, batch-first or not, with or without initial states and biases. torch's
gate blocks are ``i, f, g, o`` (LSTM) and ``r, z, n`` (GRU, whose ``n`` is always "linear before reset":
``r * (W_hn h + b_hn)``), named for ``recurrent_layer`` which puts them in the kernel's order.

The kernel is float32: a float16 / bfloat16 layer is computed in float32 (inputs and weights cast, the
outputs cast back; the state then keeps float32 precision across steps). Other dtypes are refused by name.
What the kernel cannot compute otherwise (``proj_size``, a symbolic sequence length, training mode) raises
``NotLayerKernel``: ``torch_frontend.import_exported_program`` then retries with torch's decompositions,
which spell the layer out step by step in primitive ops.
"""

from __future__ import annotations

from tvm import relax, tirx
from tvm.relax import op as _op

from .errors import UnsupportedOpError
from .recurrent_layer import GATES, whole_layer

# computed in float32 by the layer kernel
_WIDENED = ("float16", "bfloat16")

# torch's gate blocks of ``weight_ih`` / ``weight_hh`` / the biases, as ``recurrent_layer.GATES`` names them
TORCH_GATES = {
    "lstm": ("input", "forget", "cell", "output"),
    "gru": ("reset", "update", "new"),
    "rnn": ("hidden",),
}


class NotLayerKernel(Exception):
    """The layer kernel does not compute this node; the importer retries with torch's decompositions."""


def _arg(args, i, default):
    return args[i] if len(args) > i else default


def _static(expr, what: str) -> list[int]:
    dims = list(expr.ty.shape.values) if isinstance(expr.ty.shape, relax.ShapeExpr) else None
    if dims is None or not all(isinstance(d, tirx.IntImm) for d in dims):
        raise NotLayerKernel(f"{what} has a symbolic shape ({expr.ty.shape}); the layer kernel takes static ones")
    return [int(d) for d in dims]


def _layers(node, importer, kind: str):
    """``aten.{lstm,gru,rnn_tanh}.input(input, hx, params, has_biases, num_layers, dropout, train,
    bidirectional, batch_first)`` -> (output, h_n[, c_n]) as a Python tuple (torch's getitem picks from it)."""
    bb = importer.block_builder
    args = importer.retrieve_args(node)
    x, hx, params = args[0], args[1], list(args[2])
    has_biases, layers = bool(_arg(args, 3, True)), int(_arg(args, 4, 1))
    train, bidirectional, batch_first = bool(_arg(args, 6, False)), bool(_arg(args, 7, False)), \
        bool(_arg(args, 8, False))
    name = f"aten.{node.target.__name__.split('.')[0]} '{node.name}'"
    if train:
        raise NotLayerKernel(f"{name} is in training mode (dropout between layers)")
    dtype = str(x.ty.dtype)
    if dtype != "float32" and dtype not in _WIDENED:
        raise UnsupportedOpError(f"{name} on {dtype}: recurrent layers are supported in float32 (and "
                                 f"{' / '.join(_WIDENED)}, computed in float32); convert the module with "
                                 ".float() before exporting")
    nd = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    if len(params) != layers * nd * per:
        # proj_size adds weight_hr to every direction
        raise NotLayerKernel(f"{name}: {len(params)} weights for {layers} layer(s) x {nd} direction(s), expected "
                             f"{layers * nd * per} (proj_size is not supported by the layer kernel)")
    g = len(GATES[kind])
    shape = _static(x, f"{name} input")
    if len(shape) != 3:
        raise NotLayerKernel(f"{name}: unbatched {len(shape)}-D input")
    seq, batch = (shape[1], shape[0]) if batch_first else (shape[0], shape[1])
    hidden = _static(params[1], f"{name} weight_hh_l0")[1]
    if kind == "lstm":
        h0, c0 = (hx[0], hx[1]) if hx is not None and len(hx) else (None, None)
    else:
        h0, c0 = hx, None
    if batch_first:
        x = bb.emit(_op.reshape(x, (seq, batch, shape[2])) if batch == 1 else _op.permute_dims(x, [1, 0, 2]))
    if dtype != "float32":
        wide = lambda t: t if t is None else bb.emit(_op.astype(t, "float32"))  # noqa: E731
        x, h0, c0, params = wide(x), wide(h0), wide(c0), [wide(p) for p in params]
    dirs = ["forward", "reverse"] if bidirectional else ["forward"]
    hs, cs = [], []
    for layer in range(layers):
        ps = params[layer * nd * per:(layer + 1) * nd * per]
        stack = lambda i: bb.emit(_op.stack([ps[d * per + i] for d in range(nd)], axis=0))  # noqa: E731
        w, r = stack(0), stack(1)
        if tuple(int(v) for v in r.ty.shape) != (nd, g * hidden, hidden):
            raise NotLayerKernel(f"{name}: weight_hh of layer {layer} has shape {list(r.ty.shape)}, expected "
                                 f"{[g * hidden, hidden]}")
        wb, rb = (stack(2), stack(3)) if has_biases else (None, None)
        init = lambda s: None if s is None else bb.emit(  # noqa: E731
            _op.strided_slice(s, [0], [layer * nd], [(layer + 1) * nd]))
        y, y_h, y_c = whole_layer(bb, kind, x, w, r, wb, rb, init(h0), init(c0), dirs, TORCH_GATES[kind])
        hs.append(y_h)
        cs.append(y_c)
        # Y (seq, dirs, batch, hidden) -> the next layer's input (seq, batch, dirs x hidden)
        if nd > 1:
            y = bb.emit(_op.permute_dims(y, [0, 2, 1, 3]))
        x = bb.emit(_op.reshape(y, (seq, batch, nd * hidden)))
    out = x
    if batch_first:
        out = bb.emit(_op.reshape(x, (batch, seq, nd * hidden)) if batch == 1 else _op.permute_dims(x, [1, 0, 2]))
    concat = lambda ts: ts[0] if len(ts) == 1 else bb.emit(_op.concat(ts, 0))  # noqa: E731
    outs = (out, concat(hs), concat(cs)) if kind == "lstm" else (out, concat(hs))
    if dtype != "float32":
        outs = tuple(bb.emit(_op.astype(t, dtype)) for t in outs)
    return outs


def lstm(node, importer):
    return _layers(node, importer, "lstm")


def gru(node, importer):
    return _layers(node, importer, "gru")


def rnn_tanh(node, importer):
    return _layers(node, importer, "rnn")


CONVERTERS = {"lstm.input": lstm, "gru.input": gru, "rnn_tanh.input": rnn_tanh}
