"""ONNX ``LSTM``, ``GRU`` and ``RNN`` as Relax, unrolled over a static sequence length.

TVM 0.27's ONNX importer has none of the three; ``onnx_symbolic.SymbolicShapeImporter`` (the importer of
``import_onnx``) adds these converters to TVM's convert map.

A layer with the default activations and none of clip, ``sequence_lens``, peepholes, ``input_forget`` is one
kernel (``recurrent_layer``, which the PyTorch converters share): the input projection of every step and
both directions as one GEMM, then the whole step loop of both directions inside one kernel, scheduled by the
recurrence rule (a GRU without ``linear_before_reset``: two passes over the weight a step). Any other layer
is unrolled, written the way the fusion phases take it:

* the input projection of every time step is one GEMM in front of the loop: ``X`` as ``(seq * batch)``
  rows times ``W^T``, plus ``Wb`` and (where the formula allows it) ``Rb``, which are folded into one bias;
* each step is the recurrent product ``h @ R^T`` (a GEMV for a small batch), plus its rows of the
  projection, then the gates and the state update: elementwise on ``(batch, hidden)``;
* the gate rows of ``W``, ``R`` and the biases are interleaved (``[hidden, gates]`` instead of
  ``[gates, hidden]``), so the gates of one hidden unit are adjacent columns of the step's product: a
  tile of the product's columns holds whole units, and the epilogue of a tile reads only that tile. For
  constant weights the interleaving is folded at compile time (the weights are laid out once).

Semantics follow the ONNX operator definitions (opsets 7 and 14, ``layout`` included) and ONNX Runtime
where the definition is open: ``clip`` bounds the input of every gate activation (not the cell state
given to ``h``), ``sequence_lens`` stops the state of a batch entry after its length (``Y`` is zero past
it, ``Y_h``/``Y_c`` are the last valid state; a reverse direction starts at the entry's own last
element), and ``activation_alpha``/``activation_beta`` are consumed in the order of the activations that
take them.
"""

from __future__ import annotations

import numpy as np
from tvm import relax, tirx
from tvm.relax import op as _op
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from .errors import UnsupportedOpError
from .recurrent_layer import whole_layer

# name (lower case) -> (alphas taken, betas taken, default alpha, default beta); None: no default (required)
_ACTIVATION_ARGS = {
    "relu": (0, 0, None, None), "tanh": (0, 0, None, None), "sigmoid": (0, 0, None, None),
    "softsign": (0, 0, None, None), "softplus": (0, 0, None, None),
    "affine": (1, 1, None, None), "scaledtanh": (1, 1, None, None), "hardsigmoid": (1, 1, 0.2, 0.5),
    "leakyrelu": (1, 0, 0.01, None), "thresholdedrelu": (1, 0, 1.0, None), "elu": (1, 0, 1.0, None),
}


class _Activation:
    """One entry of an ``activations`` list with its alpha and beta."""

    def __init__(self, name: str, alpha, beta):
        self.name, self.alpha, self.beta = name.lower(), alpha, beta

    def __call__(self, bb, x, dtype):
        c = lambda v: relax.const(float(v), dtype)  # noqa: E731
        n, a, b = self.name, self.alpha, self.beta
        if n == "sigmoid":
            return bb.emit(_op.sigmoid(x))
        if n == "tanh":
            return bb.emit(_op.tanh(x))
        if n == "relu":
            return bb.emit(_op.nn.relu(x))
        if n == "affine":
            return bb.emit(_op.add(_op.multiply(x, c(a)), c(b)))
        if n == "leakyrelu":
            return bb.emit(_op.nn.leakyrelu(x, float(a)))
        if n == "thresholdedrelu":
            return bb.emit(_op.where(_op.greater(x, c(a)), x, c(0.0)))
        if n == "scaledtanh":
            return bb.emit(_op.multiply(_op.tanh(_op.multiply(x, c(b))), c(a)))
        if n == "hardsigmoid":
            return bb.emit(_op.clip(_op.add(_op.multiply(x, c(a)), c(b)), 0.0, 1.0))
        if n == "elu":
            return bb.emit(_op.where(_op.greater(x, c(0.0)), x,
                                     _op.multiply(c(a), _op.subtract(_op.exp(x), c(1.0)))))
        if n == "softsign":
            return bb.emit(_op.divide(x, _op.add(_op.abs(x), c(1.0))))
        if n == "softplus":
            return bb.emit(_op.log(_op.add(_op.exp(x), c(1.0))))
        raise AssertionError(n)   # _activations checked the name


def _activations(op_type: str, attr: dict, defaults: list[str], num_dir: int) -> list[list[_Activation]]:
    """Per direction, the op's activations (f, g, h for an LSTM) with their alphas and betas."""
    names = [s.decode() if isinstance(s, bytes) else s for s in attr.get("activations", ())]
    per_dir = len(defaults)
    if not names:
        names = defaults * num_dir
    elif len(names) == per_dir and num_dir == 2:
        names = names * 2      # one list given for both directions (ORT takes this too)
    if len(names) != per_dir * num_dir:
        raise UnsupportedOpError(f"ONNX {op_type}: 'activations' has {len(names)} entries, expected "
                                 f"{per_dir} per direction x {num_dir} direction(s)")
    alphas = list(attr.get("activation_alpha", ()))
    betas = list(attr.get("activation_beta", ()))
    out = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATION_ARGS:
            raise UnsupportedOpError(f"ONNX {op_type}: activation '{name}' is not one the ONNX recurrent ops "
                                     f"define ({', '.join(sorted(_ACTIVATION_ARGS))})")
        n_a, n_b, def_a, def_b = _ACTIVATION_ARGS[key]
        alpha = alphas.pop(0) if n_a and alphas else def_a
        beta = betas.pop(0) if n_b and betas else def_b
        if (n_a and alpha is None) or (n_b and beta is None):
            raise UnsupportedOpError(f"ONNX {op_type}: activation '{name}' needs activation_alpha and "
                                     "activation_beta values, the model gives too few")
        out.append(_Activation(key, alpha, beta))
    return [out[d * per_dir:(d + 1) * per_dir] for d in range(num_dir)]


def _static_shape(op_type: str, name: str, expr, dims: str) -> list:
    """The static shape of an input (an error naming the symbolic dimension otherwise)."""
    shape = expr.ty.shape
    if shape is None or not isinstance(shape, relax.ShapeExpr):
        raise UnsupportedOpError(f"ONNX {op_type}: input {name} has an unknown shape; the recurrence is unrolled "
                                 "over a static sequence length, give the model static input shapes")
    out = []
    for i, d in enumerate(shape.values):
        if not isinstance(d, tirx.IntImm):
            raise UnsupportedOpError(
                f"ONNX {op_type}: dimension {i} ({dims[i]}) of input {name} is symbolic ('{d}'); the recurrence "
                "is unrolled over a static sequence length: give this dimension a fixed size (shape_dict)")
        out.append(int(d.value))
    return out


def _interleave(bb, w, gates: int, hidden: int):
    """Rows ``[gate, unit]`` of a ``(gates * hidden, k)`` matrix (or a ``gates * hidden`` vector) as
    ``[unit, gate]``: the gates of one unit become adjacent columns of the products."""
    if gates == 1:
        return w
    if w.ty.ndim == 1:
        return bb.emit(_op.reshape(_op.permute_dims(_op.reshape(w, (gates, hidden)), [1, 0]), (gates * hidden,)))
    k = int(w.ty.shape[1])
    return bb.emit(_op.reshape(_op.permute_dims(_op.reshape(w, (gates, hidden, k)), [1, 0, 2]),
                               (gates * hidden, k)))


class _Recurrent(OnnxOpConverter):
    """What LSTM, GRU and RNN share: inputs, layout, the projection GEMM, masking and the outputs. The
    subclass's ``_step`` is one time step of one direction."""

    op_type = ""
    gates = 1
    defaults: list[str] = []
    has_cell = False

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return cls._convert(bb, inputs, attr)

    @classmethod
    def _convert(cls, bb, inputs, attr):
        inputs = list(inputs) + [None] * (8 - len(inputs))
        x, w, r, b, seq_lens, init_h = inputs[:6]
        init_c = inputs[6] if cls.has_cell else None
        peep = inputs[7] if cls.has_cell else None
        op = cls.op_type
        layout = int(attr.get("layout", 0))
        if layout not in (0, 1):
            raise UnsupportedOpError(f"ONNX {op}: layout {layout} is not 0 or 1")
        dtype = str(x.ty.dtype)
        xs = _static_shape(op, "X", x, ["seq_length", "batch_size", "input_size"] if layout == 0
                           else ["batch_size", "seq_length", "input_size"])
        seq, batch = (xs[0], xs[1]) if layout == 0 else (xs[1], xs[0])
        num_dir, gh, in_size = _static_shape(op, "W", w, ["num_directions", "gates x hidden", "input_size"])
        hidden = _static_shape(op, "R", r, ["num_directions", "gates x hidden", "hidden_size"])[2]
        direction = attr.get("direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        dirs = {"forward": ["forward"], "reverse": ["reverse"], "bidirectional": ["forward", "reverse"]}.get(direction)
        if dirs is None:
            raise UnsupportedOpError(f"ONNX {op}: direction '{direction}' is not forward, reverse or bidirectional")
        if num_dir != len(dirs) or gh != cls.gates * hidden or xs[2] != in_size:
            raise UnsupportedOpError(
                f"ONNX {op}: W has shape {[num_dir, gh, in_size]}, expected "
                f"[{len(dirs)}, {cls.gates} x {hidden}, {xs[2]}] for direction '{direction}' and X {xs}")
        if "hidden_size" in attr and int(attr["hidden_size"]) != hidden:
            raise UnsupportedOpError(f"ONNX {op}: hidden_size {attr['hidden_size']} differs from R's {hidden}")
        if seq == 0:
            raise UnsupportedOpError(f"ONNX {op}: sequence length 0 (nothing to unroll)")
        acts = _activations(op, attr, cls.defaults, num_dir)
        clip = attr.get("clip")
        ctx = dict(bb=bb, dtype=dtype, hidden=hidden, batch=batch, clip=None if clip is None else float(clip),
                   attr=attr, layout=layout)

        # X as (seq, batch, input)
        if layout == 1:
            x = bb.emit(_op.reshape(x, (seq, batch, in_size)) if batch == 1 else _op.permute_dims(x, [1, 0, 2]))

        def state(init, d):
            if init is None:
                return relax.const(np.zeros((batch, hidden), dtype), dtype)
            if layout == 0:
                return bb.emit(_op.squeeze(_op.strided_slice(init, [0], [d], [d + 1]), [0]))
            return bb.emit(_op.squeeze(_op.strided_slice(init, [1], [d], [d + 1]), [1]))

        masks = None
        if seq_lens is not None:
            lens = bb.emit(_op.reshape(_op.astype(seq_lens, "int64"), (batch, 1)))
            masks = [bb.emit(_op.less(relax.const(t, "int64"), lens)) for t in range(seq)]
        zero = relax.const(np.zeros((batch, hidden), dtype), dtype)

        ys, hs, cs = [], [], []
        layer = cls._layer_kind(attr, acts, clip, seq_lens, peep, dtype)
        if layer is not None:
            y, y_h, y_c = cls._whole_layer(ctx, layer, x, w, r, b, init_h, init_c, dirs)
            if layout == 1:
                y = bb.emit(_op.permute_dims(y, [2, 0, 1, 3]))                   # (batch, seq, dirs, hidden)
                y_h = bb.emit(_op.permute_dims(y_h, [1, 0, 2]))
                y_c = bb.emit(_op.permute_dims(y_c, [1, 0, 2])) if y_c is not None else None
            return relax.Tuple([y, y_h, y_c] if cls.has_cell else [y, y_h])
        rows = bb.emit(_op.reshape(x, (seq * batch, in_size)))
        for d, name in enumerate(dirs):
            wd = bb.emit(_op.squeeze(_op.strided_slice(w, [0], [d], [d + 1]), [0]))
            rd = bb.emit(_op.squeeze(_op.strided_slice(r, [0], [d], [d + 1]), [0]))
            if b is not None:
                bd = bb.emit(_op.squeeze(_op.strided_slice(b, [0], [d], [d + 1]), [0]))
                wb = bb.emit(_op.strided_slice(bd, [0], [0], [gh]))
                rb = bb.emit(_op.strided_slice(bd, [0], [gh], [2 * gh]))
            else:
                wb = rb = None
            weights = cls._weights(ctx, wd, rd, wb, rb, peep, d)
            proj = bb.emit(_op.matmul(rows, bb.emit(_op.permute_dims(weights["W"], [1, 0]))))
            if weights.get("bias") is not None:
                proj = bb.emit(_op.add(proj, weights["bias"]))
            proj = bb.emit(_op.reshape(proj, (seq, batch, proj.ty.shape[1])))
            h, c = state(init_h, d), state(init_c, d) if cls.has_cell else None
            out = [None] * seq
            for t in (range(seq) if name == "forward" else range(seq - 1, -1, -1)):
                # the step's rows picked by an index tensor, not by slice bounds: a slice's bounds are
                # compiled into whatever kernel takes it, so every step would be a function of its own
                # (128 kernels to compile for two layers of 64 steps); with the index as an argument the
                # steps share one function
                xp = bb.emit(_op.take(proj, relax.const(t, "int64"), axis=0))
                h_new, c_new = cls._step(ctx, weights, acts[d], xp, h, c)
                if masks is None:
                    h, c = h_new, c_new
                    out[t] = h
                else:
                    out[t] = bb.emit(_op.where(masks[t], h_new, zero))
                    h = bb.emit(_op.where(masks[t], h_new, h))
                    if cls.has_cell:
                        c = bb.emit(_op.where(masks[t], c_new, c))
            ys.append(bb.emit(_op.stack(out, axis=0)))          # (seq, batch, hidden)
            hs.append(h)
            cs.append(c)

        if layout == 0:
            y = bb.emit(_op.stack(ys, axis=1))                       # (seq, dirs, batch, hidden)
            y_h = bb.emit(_op.stack(hs, axis=0))                     # (dirs, batch, hidden)
            y_c = bb.emit(_op.stack(cs, axis=0)) if cls.has_cell else None
        else:
            y = bb.emit(_op.permute_dims(_op.stack(ys, axis=2), [1, 0, 2, 3]))   # (batch, seq, dirs, hidden)
            y_h = bb.emit(_op.stack(hs, axis=1))                     # (batch, dirs, hidden)
            y_c = bb.emit(_op.stack(cs, axis=1)) if cls.has_cell else None
        return relax.Tuple([y, y_h, y_c] if cls.has_cell else [y, y_h])

    # the kernel kind of ``recurrence_kernel`` a layer of this op can be computed by (None: unrolled)
    layer_kind: str | None = None

    @classmethod
    def _layer_kind(cls, attr, acts, clip, seq_lens, peep, dtype) -> str | None:
        """The whole-layer kernel's kind when it computes this node exactly: the default activations, no
        clip, no sequence_lens, float32 (and per op: no peepholes, no input_forget, GRU's
        linear_before_reset); anything else is unrolled step by step."""
        defaults = [n.lower() for n in cls.defaults]
        if cls.layer_kind is None or clip is not None or seq_lens is not None or dtype != "float32":
            return None
        if any([a.name for a in acts_d] != defaults for acts_d in acts):
            return None
        return cls.layer_kind

    # the gate blocks of W, R and B in ONNX's order (``recurrent_layer.GATES`` names)
    gate_order: tuple = ()

    @classmethod
    def _whole_layer(cls, ctx, kind, x, w, r, b, init_h, init_c, dirs):
        """The layer as one kernel (``recurrent_layer``), both directions in it. (Y (seq, dirs, batch,
        hidden), Y_h (dirs, batch, hidden), Y_c or None)."""
        bb, layout, gh = ctx["bb"], ctx["layout"], cls.gates * ctx["hidden"]
        wb = rb = None
        if b is not None:
            wb = bb.emit(_op.strided_slice(b, [1], [0], [gh]))                  # (dirs, g * hidden)
            rb = bb.emit(_op.strided_slice(b, [1], [gh], [2 * gh]))

        def state(init):
            return init if init is None or layout == 0 else bb.emit(_op.permute_dims(init, [1, 0, 2]))
        return whole_layer(bb, kind, x, w, r, wb, rb, state(init_h), state(init_c), dirs, cls.gate_order)

    @classmethod
    def _weights(cls, ctx, wd, rd, wb, rb, peep, d) -> dict:
        """Per direction: ``W`` (the projection's weight, gate rows interleaved), ``bias`` (added to the
        projection) and what ``_step`` reads."""
        bb, g, hidden = ctx["bb"], cls.gates, ctx["hidden"]
        bias = None
        if wb is not None:
            bias = _interleave(bb, bb.emit(_op.add(wb, rb)), g, hidden)
        return {"W": _interleave(bb, wd, g, hidden), "bias": bias,
                "RT": bb.emit(_op.permute_dims(_interleave(bb, rd, g, hidden), [1, 0]))}

    @classmethod
    def _gates(cls, ctx, weights, xp, h):
        """``h @ R^T + xp`` as ``(batch, hidden, gates)`` and a function giving gate ``i`` as (batch, hidden)."""
        bb = ctx["bb"]
        pre = bb.emit(_op.add(_op.matmul(h, weights["RT"]), xp))
        pre = bb.emit(_op.reshape(pre, (ctx["batch"], ctx["hidden"], cls.gates)))

        def gate(i):
            return bb.emit(_op.squeeze(_op.strided_slice(pre, [2], [i], [i + 1]), [2]))
        return gate

    @staticmethod
    def _act(ctx, fn, x):
        if ctx["clip"] is not None:
            x = ctx["bb"].emit(_op.clip(x, -ctx["clip"], ctx["clip"]))
        return fn(ctx["bb"], x, ctx["dtype"])

    @classmethod
    def _step(cls, ctx, weights, acts, xp, h, c):
        raise NotImplementedError


class LSTM(_Recurrent):
    """ONNX LSTM (gates i, o, f, c; peepholes i, o, f; ``input_forget``)."""

    op_type, gates, defaults, has_cell = "LSTM", 4, ["Sigmoid", "Tanh", "Tanh"], True
    layer_kind, gate_order = "lstm", ("input", "output", "forget", "cell")

    @classmethod
    def _layer_kind(cls, attr, acts, clip, seq_lens, peep, dtype):
        if peep is not None or int(attr.get("input_forget", 0)):
            return None
        return super()._layer_kind(attr, acts, clip, seq_lens, peep, dtype)

    @classmethod
    def _weights(cls, ctx, wd, rd, wb, rb, peep, d):
        out = super()._weights(ctx, wd, rd, wb, rb, peep, d)
        bb, hidden = ctx["bb"], ctx["hidden"]
        if peep is not None:
            pd = bb.emit(_op.squeeze(_op.strided_slice(peep, [0], [d], [d + 1]), [0]))
            for i, name in enumerate("iof"):
                out["P" + name] = bb.emit(_op.strided_slice(pd, [0], [i * hidden], [(i + 1) * hidden]))
        return out

    @classmethod
    def _step(cls, ctx, weights, acts, xp, h, c):
        bb = ctx["bb"]
        f_act, g_act, h_act = acts
        gate = cls._gates(ctx, weights, xp, h)

        def peep(x, name, cell):
            p = weights.get("P" + name)
            return x if p is None else bb.emit(_op.add(x, _op.multiply(p, cell)))
        i = cls._act(ctx, f_act, peep(gate(0), "i", c))
        if int(ctx["attr"].get("input_forget", 0)):
            f = bb.emit(_op.subtract(relax.const(1.0, ctx["dtype"]), i))
        else:
            f = cls._act(ctx, f_act, peep(gate(2), "f", c))
        cand = cls._act(ctx, g_act, gate(3))
        c_new = bb.emit(_op.add(_op.multiply(f, c), _op.multiply(i, cand)))
        o = cls._act(ctx, f_act, peep(gate(1), "o", c_new))
        h_new = bb.emit(_op.multiply(o, h_act(bb, c_new, ctx["dtype"])))
        return h_new, c_new


class GRU(_Recurrent):
    """ONNX GRU (gates z, r, h; ``linear_before_reset``)."""

    op_type, gates, defaults = "GRU", 3, ["Sigmoid", "Tanh"]
    layer_kind, gate_order = "gru", ("update", "reset", "new")

    @classmethod
    def _layer_kind(cls, attr, acts, clip, seq_lens, peep, dtype):
        kind = super()._layer_kind(attr, acts, clip, seq_lens, peep, dtype)
        if kind is not None and not int(attr.get("linear_before_reset", 0)):
            return "gru_lbr0"    # (r * h) @ Rh^T needs every unit's r before the product: two passes a step
        return kind

    @classmethod
    def _weights(cls, ctx, wd, rd, wb, rb, peep, d):
        bb, hidden = ctx["bb"], ctx["hidden"]
        lbr = int(ctx["attr"].get("linear_before_reset", 0))
        out = {"W": _interleave(bb, wd, 3, hidden), "bias": None}
        if wb is not None:
            # Rb of z and r adds to the projection; Rb of h only when the reset gate does not multiply it
            rb_in = rb
            if lbr:
                rb_in = bb.emit(_op.concat([_op.strided_slice(rb, [0], [0], [2 * hidden]),
                                            relax.const(np.zeros(hidden, ctx["dtype"]), ctx["dtype"])], 0))
            out["bias"] = _interleave(bb, bb.emit(_op.add(wb, rb_in)), 3, hidden)
        if lbr:
            # Rb of h (zeros without B) added to the whole product right after it: the product's first
            # consumer then covers its columns one to one, the GEMV rule's per-panel epilogue (a reshape
            # first would hand it (hidden, 3) tiles that are not the panels)
            zeros = relax.const(np.zeros(2 * hidden, ctx["dtype"]), ctx["dtype"])
            rbh = (bb.emit(_op.strided_slice(rb, [0], [2 * hidden], [3 * hidden])) if rb is not None
                   else relax.const(np.zeros(hidden, ctx["dtype"]), ctx["dtype"]))
            out["Rb3"] = _interleave(bb, bb.emit(_op.concat([zeros, rbh], 0)), 3, hidden)
            # one product h @ [Rz; Rr; Rh]^T per step; the reset gate multiplies its h part afterwards
            out["RT"] = bb.emit(_op.permute_dims(_interleave(bb, rd, 3, hidden), [1, 0]))
        else:
            # h @ [Rz; Rr]^T, then (r * h) @ Rh^T: two products per step
            rzr = bb.emit(_op.strided_slice(rd, [0], [0], [2 * hidden]))
            out["RT_zr"] = bb.emit(_op.permute_dims(_interleave(bb, rzr, 2, hidden), [1, 0]))
            out["RT_h"] = bb.emit(_op.permute_dims(_op.strided_slice(rd, [0], [2 * hidden], [3 * hidden]), [1, 0]))
        return out

    @classmethod
    def _step(cls, ctx, weights, acts, xp, h, c):
        bb, batch, hidden, dtype = ctx["bb"], ctx["batch"], ctx["hidden"], ctx["dtype"]
        f_act, g_act = acts
        xp3 = bb.emit(_op.reshape(xp, (batch, hidden, 3)))

        def part(t3, i):
            return bb.emit(_op.squeeze(_op.strided_slice(t3, [2], [i], [i + 1]), [2]))
        if "RT" in weights:      # linear_before_reset
            hr = bb.emit(_op.add(_op.matmul(h, weights["RT"]), weights["Rb3"]))
            hr = bb.emit(_op.reshape(hr, (batch, hidden, 3)))
            z = cls._act(ctx, f_act, bb.emit(_op.add(part(xp3, 0), part(hr, 0))))
            r = cls._act(ctx, f_act, bb.emit(_op.add(part(xp3, 1), part(hr, 1))))
            rh = part(hr, 2)
            cand = cls._act(ctx, g_act, bb.emit(_op.add(part(xp3, 2), _op.multiply(r, rh))))
        else:
            hzr = bb.emit(_op.reshape(_op.matmul(h, weights["RT_zr"]), (batch, hidden, 2)))
            z = cls._act(ctx, f_act, bb.emit(_op.add(part(xp3, 0), part(hzr, 0))))
            r = cls._act(ctx, f_act, bb.emit(_op.add(part(xp3, 1), part(hzr, 1))))
            rh = bb.emit(_op.matmul(_op.multiply(r, h), weights["RT_h"]))
            cand = cls._act(ctx, g_act, bb.emit(_op.add(part(xp3, 2), rh)))
        # h' = (1 - z) * cand + z * h = cand + z * (h - cand)
        h_new = bb.emit(_op.add(cand, _op.multiply(z, _op.subtract(h, cand))))
        return h_new, None


class RNN(_Recurrent):
    """ONNX RNN (one gate)."""

    op_type, gates, defaults = "RNN", 1, ["Tanh"]
    layer_kind, gate_order = "rnn", ("hidden",)

    @classmethod
    def _step(cls, ctx, weights, acts, xp, h, c):
        bb = ctx["bb"]
        pre = bb.emit(_op.add(_op.matmul(h, weights["RT"]), xp))
        return cls._act(ctx, acts[0], pre), None


CONVERTERS = {"LSTM": LSTM, "GRU": GRU, "RNN": RNN}
