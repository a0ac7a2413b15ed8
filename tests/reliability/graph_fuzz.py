"""Hypothesis strategy for random Relax dataflow graphs over the ops our passes touch.

Extends the grouping fuzzer's vocabulary (``tests/grouping/graph_gen.py``: its unary/binary ops and whole
``random_graph(seed)`` graphs are one of the drawn modes) with what the pattern and graph-fusion passes
match: bias + activation epilogues on matmul/conv2d, layer_norm / rms_norm, scaled+masked softmax,
concat / strided_slice / split / reshape round trips, explicit tuples, several consumers of one value,
odd sizes and a symbolic leading dim.

Also the conv kinds of mobile/CNN blocks (depthwise, grouped, squeeze-excite, pre-activation BatchNorm,
convs whose outputs are concatenated and consumed), bool ops (compare, and/or/xor/not feeding ``where``),
integer arithmetic (int8/int32/int64 round trips) and a data-dependent length (``arange`` of a count read
from the input, as ONNX Range/NonZero give), whose value and, as a side output, whose shape depend on data.

And GEMM/conv epilogues with layout ops between their elementwise ops (``layout_epilogue``): a projection
split into heads whose width need not divide, or be divided by, a register block (LeViT's 8 x 80), broadcast
scales per head or per column, transposes, a flatten into rows of another width, a conv's plane flattened
and transposed into tokens (a ViT stem), an NCHW plane turned channels-last into a LayerNorm and a projection
whose rows are the plane's pixels, split into heads over the flattened plane (GCViT's window attention: rows
a register block does not divide, padded in the accumulator). The epilogue's result is returned too, so it
ends a kernel.

A graph is drawn as a ``GraphSpec`` (plain data, so hypothesis prints a readable minimal failing example)
and built with ``spec.build()``. Every op keeps the working shape, so any value can feed any later op;
values stay bounded (tanh/sigmoid/norms before exp, division only by 1 + sigmoid). Bool and integer values
are computed from the graph's inputs (exact in every pipeline) or select continuously (``where(a > b, a, b)``),
so a last-bit difference between pipelines never flips a result; bool/int/data-dependent side outputs are
returned after the graph's outputs and compared exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st
from tvm import relax, tirx

try:  # the grouping fuzzer; reused, not duplicated
    from tests.grouping.graph_gen import BINARY, UNARY, _unary, random_graph
except ImportError:  # pragma: no cover - the grouping tests are not present
    BINARY, UNARY, random_graph = ("add", "multiply", "subtract", "maximum"), ("relu", "tanh", "sigmoid"), None

    def _unary(kind, x):
        return {"relu": relax.op.nn.relu, "tanh": relax.op.tanh, "sigmoid": relax.op.sigmoid}[kind](x)

UNARY_EXTRA = ("gelu", "gelu_tanh", "silu", "clip6", "leaky_relu", "sqrt_abs", "erf")
BINARY_EXTRA = ("minimum", "divide_pos")
OPS = ("unary", "binary", "bias", "reduce_epilogue", "matmul", "conv2d", "layer_norm", "rms_norm", "softmax",
       "concat_slice", "split_concat", "reshape_round_trip", "transpose", "tuple",
       "conv_kind", "logic", "int_ops", "data_dependent", "layout_epilogue")
ODD_DIMS = (1, 3, 5, 7, 8, 12, 16)


@dataclass(frozen=True)
class OpSpec:
    kind: str
    a: int                 # operand indices into the value list (taken modulo its length)
    b: int = 0
    variant: str = ""      # which unary/binary/reduction/... flavour
    seed: int = 0          # constants (weights, biases, masks) come from this seed


@dataclass(frozen=True)
class GraphSpec:
    rank: int                                  # 2: (M, N), 3: (B, S, H), 4: (N, C, H, W)
    shape: tuple[int, ...]
    symbolic: bool = False                     # leading dim is a tirx.Var (runs at several sizes)
    two_inputs: bool = False
    ops: tuple[OpSpec, ...] = ()
    outputs: tuple[int, ...] = (-1,)           # value indices returned (a tuple when more than one)
    legacy_seed: int | None = None             # set: the graph is graph_gen.random_graph(seed) instead

    def build(self):
        if self.legacy_seed is not None:
            return random_graph(self.legacy_seed)
        return _Builder(self).build()

    def concrete_sizes(self) -> list[int]:
        """Values of the symbolic leading dim to run at (two, one of them odd)."""
        return [self.shape[0], self.shape[0] + 3] if self.symbolic else [self.shape[0]]


def _const(rng, shape, scale=1.0):
    return relax.const((rng.standard_normal(shape) * scale).astype("float32"))


class _Builder:
    def __init__(self, spec: GraphSpec):
        self.spec = spec
        self.bb = relax.BlockBuilder()

    def build(self):
        self.side = []                  # bool / int / data-dependent values returned after the outputs
        self.n_lengths = 0
        s = self.spec
        lead = tirx.Var("n", "int64") if s.symbolic else s.shape[0]
        shape = (lead, *s.shape[1:])
        params = [relax.Var("x", relax.TensorType(shape, "float32"))]
        if s.two_inputs:
            params.append(relax.Var("y", relax.TensorType(shape, "float32")))
        self.shape = shape
        self.params = params
        bb = self.bb
        with bb.function("main", params):
            with bb.dataflow():
                vals = list(params)
                for op in s.ops:
                    vals.append(self.emit(op, vals))
                outs = []
                for i in s.outputs:   # distinct, computed values only (a param returned as-is is trivial)
                    v = vals[i % len(vals)]
                    if not any(v.same_as(o) for o in outs + params):
                        outs.append(v)
                outs = (outs or [vals[-1]]) + self.side
                res = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
            bb.emit_func_output(res)
        return bb.get()

    # every emitter returns a value with the working shape
    def emit(self, op: OpSpec, vals):
        a = vals[op.a % len(vals)]
        b = vals[op.b % len(vals)]
        rng = np.random.default_rng(op.seed)
        return self.bb.emit(getattr(self, "_" + op.kind)(op, a, b, rng))

    def _unary(self, op, a, b, rng):
        o = relax.op
        extra = {
            "gelu": lambda: o.nn.gelu(a), "gelu_tanh": lambda: o.nn.gelu_tanh(a), "silu": lambda: o.nn.silu(a),
            "clip6": lambda: o.clip(a, 0.0, 6.0),
            "leaky_relu": lambda: o.nn.leakyrelu(a, 0.1), "sqrt_abs": lambda: o.sqrt(o.abs(a)),
            "erf": lambda: o.erf(a),
        }
        return extra[op.variant]() if op.variant in extra else _unary(op.variant, a)

    def _binary(self, op, a, b, rng):
        if op.variant == "divide_pos":
            return relax.op.divide(a, relax.op.add(relax.const(1.0, "float32"), relax.op.sigmoid(b)))
        return getattr(relax.op, op.variant)(a, b)

    def _bias_shape(self):
        r = self.spec.rank
        return (self.spec.shape[1], 1, 1) if r == 4 else (self.spec.shape[-1],)

    def _bias(self, op, a, b, rng):
        return relax.op.add(a, _const(rng, self._bias_shape()))

    def _reduce_epilogue(self, op, a, b, rng):
        o = relax.op
        if op.variant == "max":
            return o.subtract(a, o.max(a, axis=[-1], keepdims=True))
        if op.variant == "mean":
            return o.subtract(a, o.mean(a, axis=[-1], keepdims=True))
        return o.divide(a, o.add(relax.const(1.0, "float32"), o.sum(o.sigmoid(a), axis=[-1], keepdims=True)))

    def _matmul(self, op, a, b, rng):
        """x @ W (+ bias) (+ activation): the matmul epilogue patterns; W is square so shapes stay."""
        k = self.spec.shape[-1]
        y = relax.op.matmul(a, _const(rng, (k, k), 1.0 / np.sqrt(k)))
        if op.variant in ("bias", "bias_relu", "bias_gelu"):
            y = relax.op.add(y, _const(rng, (k,)))
        if op.variant == "bias_relu":
            y = relax.op.nn.relu(y)
        if op.variant == "bias_gelu":
            y = relax.op.nn.gelu(y)
        return y

    def _conv2d(self, op, a, b, rng):
        """3x3 (or 1x1) same-padding conv (+ bias) (+ relu / residual add); matmul on non-4-D values."""
        if self.spec.rank != 4:
            return self._matmul(op, a, b, rng)
        c = self.spec.shape[1]
        ks = 1 if op.variant == "1x1" else 3
        w = _const(rng, (c, c, ks, ks), 1.0 / (ks * np.sqrt(c)))
        y = relax.op.nn.conv2d(a, w, padding=[ks // 2] * 4)
        if op.variant != "plain":
            y = relax.op.add(y, _const(rng, (1, c, 1, 1)))
        if op.variant in ("bias_relu", "1x1"):
            y = relax.op.nn.relu(y)
        if op.variant == "residual":
            y = relax.op.add(y, b)
        return y

    def _layer_norm(self, op, a, b, rng):
        h = self.spec.shape[-1]
        x = relax.op.add(a, b) if op.variant == "residual" else a
        return relax.op.nn.layer_norm(x, _const(rng, (h,)), _const(rng, (h,)), axes=[-1])

    def _rms_norm(self, op, a, b, rng):
        h = self.spec.shape[-1]
        x = relax.op.add(a, b) if op.variant == "residual" else a
        return relax.op.nn.rms_norm(x, _const(rng, (h,)), axes=[-1])

    def _softmax(self, op, a, b, rng):
        x = a
        if op.variant in ("scale", "scale_mask"):
            x = relax.op.multiply(x, relax.const(0.125, "float32"))
        if op.variant in ("mask", "scale_mask"):
            x = relax.op.add(x, _const(rng, tuple(self.spec.shape[1:])))
        return relax.op.nn.softmax(x, axis=-1)

    def _concat_slice(self, op, a, b, rng):
        """concat([a, b]) then the half picked by ``variant`` (after a relu on the concat: split fusion)."""
        ax = 1 if self.spec.rank == 4 else self.spec.rank - 1
        n = self.spec.shape[ax]
        cat = relax.op.concat([a, b], axis=ax)
        if op.variant == "relu":
            cat = self.bb.emit(relax.op.nn.relu(cat))
        begin = n if op.variant == "second" else 0
        return relax.op.strided_slice(cat, axes=[ax], begin=[begin], end=[begin + n])

    def _split_concat(self, op, a, b, rng):
        """split into two (uneven when odd) along the last axis, act on one part, concat back; tuple values."""
        n = self.spec.shape[-1]
        if n < 2:
            return relax.op.nn.relu(a)
        parts = self.bb.emit(relax.op.split(a, [n // 2], axis=-1))
        left = self.bb.emit(relax.TupleGetItem(parts, 0))
        right = self.bb.emit(relax.op.tanh(relax.TupleGetItem(parts, 1)))
        return relax.op.concat([right, left] if op.variant == "swap" else [left, right], axis=-1)

    def _reshape_round_trip(self, op, a, b, rng):
        """Flatten the trailing dims, act, restore (the static trailing dims make it legal for symbolic n)."""
        tail = int(np.prod(self.spec.shape[1:]))
        flat = self.bb.emit(relax.op.reshape(a, (self.shape[0], tail)))
        flat = self.bb.emit(relax.op.nn.relu(flat) if op.variant == "relu" else relax.op.negative(flat))
        return relax.op.reshape(flat, self.shape)

    def _transpose(self, op, a, b, rng):
        r = self.spec.rank
        axes = list(range(r))
        axes[-1], axes[-2] = axes[-2], axes[-1]
        t = self.bb.emit(relax.op.permute_dims(a, axes))
        t = self.bb.emit(relax.op.sigmoid(t))
        return relax.op.permute_dims(t, axes)

    def _tuple(self, op, a, b, rng):
        """An explicit tuple value with both fields used downstream."""
        t = self.bb.emit(relax.Tuple([a, b]))
        return relax.op.multiply(relax.TupleGetItem(t, 0), relax.op.tanh(relax.TupleGetItem(t, 1)))

    # ---- conv kinds of mobile / CNN blocks (4-D; a matmul on other ranks) ---------------------------------
    def _conv_kind(self, op, a, b, rng):
        if self.spec.rank != 4:
            return self._matmul(op, a, b, rng)
        o = relax.op
        c = self.spec.shape[1]
        if op.variant in ("depthwise", "grouped"):
            groups = c if op.variant == "depthwise" or c % 2 else 2
            w = _const(rng, (c, c // groups, 3, 3), 1.0 / (3 * np.sqrt(c // groups)))
            y = o.add(o.nn.conv2d(a, w, padding=[1, 1, 1, 1], groups=groups), _const(rng, (1, c, 1, 1)))
            return o.nn.relu(y)
        if op.variant == "se":
            r = max(1, c // 2)
            s = self.bb.emit(o.mean(a, axis=[2, 3], keepdims=True))
            s = self.bb.emit(o.nn.relu(o.add(o.nn.conv2d(s, _const(rng, (r, c, 1, 1), 1 / np.sqrt(c))),
                                              _const(rng, (1, r, 1, 1)))))
            s = self.bb.emit(o.sigmoid(o.add(o.nn.conv2d(s, _const(rng, (c, r, 1, 1), 1 / np.sqrt(r))),
                                             _const(rng, (1, c, 1, 1)))))
            return o.multiply(a, s)
        if op.variant == "preact_bn":
            mean, var = _const(rng, (c,), 0.5), relax.const(rng.uniform(0.5, 2.0, (c,)).astype("float32"))
            bn = self.bb.emit(o.nn.batch_norm(a, _const(rng, (c,)), _const(rng, (c,)), mean, var, axis=1))
            act = self.bb.emit(o.nn.relu(relax.TupleGetItem(bn, 0)))
            return o.nn.conv2d(act, _const(rng, (c, c, 3, 3), 1.0 / (3 * np.sqrt(c))), padding=[1, 1, 1, 1])
        # concat_convs: two convs into one concat (split fusion's input), then two consumers of the concat
        if c < 2:
            return o.nn.relu(o.nn.conv2d(a, _const(rng, (c, c, 3, 3), 1 / 3.0), padding=[1, 1, 1, 1]))
        c1 = c // 2
        left = self.bb.emit(o.nn.conv2d(a, _const(rng, (c1, c, 1, 1), 1 / np.sqrt(c))))
        right = self.bb.emit(o.nn.conv2d(b, _const(rng, (c - c1, c, 3, 3), 1 / (3 * np.sqrt(c))), padding=[1] * 4))
        cat = self.bb.emit(o.concat([left, right], axis=1))
        act = self.bb.emit(o.nn.relu(cat))
        return o.add(act, o.nn.conv2d(cat, _const(rng, (c, c, 1, 1), 1 / np.sqrt(c))))

    # ---- bool ops ----------------------------------------------------------------------------------------
    def _logic(self, op, a, b, rng):
        o = relax.op
        zero = relax.const(0.0, "float32")
        if op.variant == "max_where":
            return o.where(o.greater(a, b), a, b)
        if op.variant == "and_mul":
            return o.where(o.logical_and(o.greater(a, zero), o.greater(b, zero)), o.multiply(a, b), zero)
        if op.variant == "or_relu":
            return o.where(o.logical_or(o.greater(a, zero), o.greater(b, zero)),
                           o.add(o.nn.relu(a), o.nn.relu(b)), zero)
        if op.variant == "xor_mul":
            return o.where(o.logical_xor(o.greater(a, zero), o.less(b, zero)), o.multiply(a, b), zero)
        if op.variant == "not_leaky":
            return o.where(o.logical_not(o.greater(a, zero)), o.multiply(a, relax.const(0.1, "float32")), a)
        # mask_out: a mask of the inputs (exact) selects, and is also returned
        x = self.params[0]
        other = self.params[1] if len(self.params) > 1 else relax.const(0.25, "float32")
        mask = self.bb.emit(o.logical_and(o.greater(x, other), o.less(x, relax.const(1.5, "float32"))))
        self.side.append(mask)
        return o.where(mask, a, o.multiply(a, relax.const(0.5, "float32")))

    # ---- integer arithmetic on the inputs, back to float ------------------------------------------------
    def _int_ops(self, op, a, b, rng):
        o = relax.op
        dtype = op.variant
        x = self.params[0]
        q = self.bb.emit(o.astype(o.multiply(x, relax.const(4.0, "float32")), dtype))     # exact: x * 2^2
        r = self.bb.emit(o.add(o.multiply(q, relax.const(3, dtype)), relax.const(1, dtype)))
        r = self.bb.emit(o.floor_divide(o.maximum(r, relax.const(-20, dtype)), relax.const(2, dtype)))
        r = self.bb.emit(o.minimum(r, relax.const(30, dtype)))
        if dtype == "int64":
            self.side.append(r)
        return o.add(a, o.multiply(o.astype(r, "float32"), relax.const(0.125, "float32")))

    # ---- a length read from the data (ONNX Range / NonZero) ------------------------------------------------
    def _data_dependent(self, op, a, b, rng):
        o = relax.op
        x = self.params[0]
        count = self.bb.emit(o.sum(o.astype(o.greater(x, relax.const(0.0, "float32")), "int64")))
        shape = self.bb.emit(o.tensor_to_shape(self.bb.emit(o.reshape(count, [1]))))
        n = tirx.Var(f"len{self.n_lengths}", "int64")
        self.n_lengths += 1
        self.bb.match_cast(shape, relax.ShapeType([n]))
        steps = self.bb.emit(o.arange(0, n, 1, dtype="float32"))
        if op.variant == "side":
            self.side.append(self.bb.emit(o.multiply(steps, relax.const(0.5, "float32"))))
        total = self.bb.emit(o.sum(steps))                                     # n (n - 1) / 2, exact
        nf = self.bb.emit(o.astype(count, "float32"))
        scale = self.bb.emit(o.divide(total, o.add(relax.const(1.0, "float32"), o.multiply(nf, nf))))
        return o.add(a, scale)


    # ---- GEMM / conv epilogues with layout ops between the elementwise ops ---------------------------------
    def _layout_epilogue(self, op, a, b, rng):
        """``x @ W1`` (or a conv) -> layout ops and broadcasts -> returned; then back to the working shape
        (``@ W2``, or the inverse layout ops) so later ops can use it. Head widths 5, 20 and 40 are cut by
        register blocks of 8, 16 or 32 columns."""
        o = relax.op
        if self.spec.rank == 4 and op.variant in ("tokens", "flatten"):
            return self._conv_layout_epilogue(op, a, rng)
        if self.spec.rank == 4 and op.variant == "plane_gemm":
            return self._plane_gemm(a, rng)
        k = self.spec.shape[-1]
        heads, d = (2, 20) if op.variant == "flatten" else (int(rng.integers(1, 4)), int(rng.choice([5, 20, 40])))
        n = heads * d
        lead = tuple(self.shape[:-1])
        y = self.bb.emit(o.matmul(a, _const(rng, (k, n), 1.0 / np.sqrt(k))))
        if op.variant == "flatten" and isinstance(lead[0], int):
            rows = int(np.prod(lead)) * n // 8                     # rows of 8 across the GEMM's rows
            z = self.bb.emit(o.reshape(y, (rows, 8)))
            z = self.bb.emit(o.add(o.multiply(z, _const(rng, (8,))), _const(rng, (rows, 1))))
            z = self.bb.emit(o.reshape(z, (*lead, n)))
        else:
            z = self.bb.emit(o.reshape(y, (*lead, heads, d)))
            z = self.bb.emit(o.multiply(z, _const(rng, (heads, 1))))              # per head, broadcast
            z = self.bb.emit(o.add(z, _const(rng, (d,))))                          # per column of a head
            if op.variant == "transpose":
                axes = list(range(len(lead) + 2))
                axes[-1], axes[-2] = axes[-2], axes[-1]
                z = self.bb.emit(o.sigmoid(self.bb.emit(o.permute_dims(z, axes))))   # (..., d, heads)
            self.side.append(z)
            z = self.bb.emit(o.reshape(z, (*lead, n)))
        return o.matmul(z, _const(rng, (n, k), 1.0 / np.sqrt(n)))

    def _plane_gemm(self, a, rng):
        """NCHW -> NHWC -> LayerNorm -> @ W + b over the plane's pixels -> (N, H*W, 2, heads, d) -> heads
        first (returned) -> back through @ W2 to NCHW."""
        o = relax.op
        nb, c, h, w = self.spec.shape
        lead = self.shape[0]
        heads, d = 2, 4
        n = 2 * heads * d
        t = self.bb.emit(o.nn.layer_norm(self.bb.emit(o.permute_dims(a, [0, 2, 3, 1])), _const(rng, (c,)),
                                         _const(rng, (c,)), axes=[-1]))
        y = self.bb.emit(o.add(o.matmul(t, _const(rng, (c, n), 1.0 / np.sqrt(c))), _const(rng, (n,))))
        z = self.bb.emit(o.permute_dims(self.bb.emit(o.reshape(y, (lead, h * w, 2, heads, d))), [2, 0, 3, 1, 4]))
        self.side.append(z)
        back = self.bb.emit(o.reshape(o.permute_dims(z, [1, 3, 0, 2, 4]), (lead, h, w, n)))
        return o.permute_dims(o.matmul(back, _const(rng, (n, c), 1.0 / np.sqrt(n))), [0, 3, 1, 2])

    def _conv_layout_epilogue(self, op, a, rng):
        """conv -> (N, C, H*W) -> tokens (N, H*W, C) x per-channel scale (+ a flatten across planes) -> back."""
        o = relax.op
        nb, c, h, w = self.spec.shape
        lead = self.shape[0]
        y = self.bb.emit(o.nn.conv2d(a, _const(rng, (c, c, 3, 3), 1.0 / (3 * np.sqrt(c))), padding=[1] * 4))
        if op.variant == "flatten" and isinstance(lead, int) and (nb * c * h * w) % 4 == 0:
            z = self.bb.emit(o.reshape(y, (nb * c * h * w // 4, 4)))
            z = self.bb.emit(o.nn.relu(o.add(z, _const(rng, (4,)))))
            self.side.append(z)
            return o.reshape(z, self.shape)
        t = self.bb.emit(o.permute_dims(self.bb.emit(o.reshape(y, (lead, c, h * w))), [0, 2, 1]))
        t = self.bb.emit(o.add(o.multiply(t, _const(rng, (c,))), _const(rng, (h * w, 1))))
        self.side.append(t)
        return o.reshape(o.permute_dims(t, [0, 2, 1]), self.shape)


VARIANTS = {
    "unary": UNARY + UNARY_EXTRA,
    "binary": BINARY + BINARY_EXTRA,
    "bias": ("",),
    "reduce_epilogue": ("max", "mean", "sum"),
    "matmul": ("plain", "bias", "bias_relu", "bias_gelu"),
    "conv2d": ("plain", "bias", "bias_relu", "residual", "1x1"),
    "layer_norm": ("plain", "residual"),
    "rms_norm": ("plain", "residual"),
    "softmax": ("plain", "scale", "mask", "scale_mask"),
    "concat_slice": ("first", "second", "relu"),
    "split_concat": ("keep", "swap"),
    "reshape_round_trip": ("relu", "neg"),
    "transpose": ("",),
    "tuple": ("",),
    "conv_kind": ("depthwise", "grouped", "se", "preact_bn", "concat_convs"),
    "logic": ("max_where", "and_mul", "or_relu", "xor_mul", "not_leaky", "mask_out"),
    "int_ops": ("int8", "int32", "int64"),
    "data_dependent": ("value", "side"),
    "layout_epilogue": ("heads", "transpose", "flatten", "tokens", "plane_gemm"),
}


class _Draws:
    """The choices a graph is made of, from hypothesis (shrinkable) or from a numpy seed (sweeps)."""

    def __init__(self, draw=None, rng=None):
        self.draw, self.rng = draw, rng

    def pick(self, options):
        options = tuple(options)
        if self.draw is not None:
            return self.draw(st.sampled_from(options))
        return options[int(self.rng.integers(0, len(options)))]

    def int(self, lo, hi):
        if self.draw is not None:
            return self.draw(st.integers(lo, hi))
        return int(self.rng.integers(lo, hi + 1))

    def bool(self):
        return bool(self.int(0, 1))


def _op(d: _Draws) -> OpSpec:
    kind = d.pick(OPS)
    return OpSpec(kind, d.int(0, 15), d.int(0, 15), d.pick(VARIANTS[kind]), d.int(0, 2**16))


def _graph(d: _Draws, max_ops: int, allow_symbolic: bool, legacy: bool) -> GraphSpec:
    if legacy and random_graph is not None and d.int(0, 7) == 0:
        return GraphSpec(rank=0, shape=(), legacy_seed=d.int(0, 10**6))
    rank = d.pick((2, 3, 4))
    if rank == 2:
        shape = (d.pick(ODD_DIMS), d.pick(ODD_DIMS))
    elif rank == 3:
        shape = (d.pick((1, 2, 3)), d.pick(ODD_DIMS), d.pick(ODD_DIMS))
    else:
        shape = (d.pick((1, 2)), d.pick((1, 3, 4, 8)), d.pick((3, 5, 8)), d.pick((3, 5, 8)))
    ops = tuple(_op(d) for _ in range(d.int(1, max_ops)))
    outputs = tuple(d.int(-4, -1) for _ in range(d.int(1, 2)))
    symbolic = allow_symbolic and d.int(0, 3) == 0
    return GraphSpec(rank, shape, symbolic, d.bool(), ops, outputs)


@st.composite
def graph_specs(draw, max_ops: int = 8, allow_symbolic: bool = True, legacy: bool = True):
    """Hypothesis strategy of ``GraphSpec``s."""
    return _graph(_Draws(draw=draw), max_ops, allow_symbolic, legacy)


def random_spec(seed: int, max_ops: int = 10, allow_symbolic: bool = True, legacy: bool = True) -> GraphSpec:
    """The same distribution driven by one integer seed (for sweeps that must count, not stop, on failure)."""
    return _graph(_Draws(rng=np.random.default_rng(seed)), max_ops, allow_symbolic, legacy)


def inputs_for(mod, spec: GraphSpec, lead: int | None, seed: int = 0) -> list[np.ndarray]:
    """Random inputs; a symbolic leading dim takes the value ``lead``."""
    rng = np.random.default_rng(seed)
    out = []
    for p in mod["main"].params:
        shape = [lead if not isinstance(d, tirx.IntImm) else int(d) for d in p.ty.shape]
        out.append(rng.standard_normal(shape).astype("float32"))
    return out
