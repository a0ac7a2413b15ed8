"""Hypothesis strategy for random Relax dataflow graphs over the ops our passes touch.

Extends the grouping fuzzer's vocabulary (``tests/grouping/graph_gen.py``: its unary/binary ops and whole
``random_graph(seed)`` graphs are one of the drawn modes) with what the pattern and graph-fusion passes
match: bias + activation epilogues on matmul/conv2d, layer_norm / rms_norm, scaled+masked softmax,
concat / strided_slice / split / reshape round trips, explicit tuples, several consumers of one value,
odd sizes and a symbolic leading dim.

A graph is drawn as a ``GraphSpec`` (plain data, so hypothesis prints a readable minimal failing example)
and built with ``spec.build()``. Every op keeps the working shape, so any value can feed any later op;
values stay bounded (tanh/sigmoid/norms before exp, division only by 1 + sigmoid).
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
       "concat_slice", "split_concat", "reshape_round_trip", "transpose", "tuple")
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
        s = self.spec
        lead = tirx.Var("n", "int64") if s.symbolic else s.shape[0]
        shape = (lead, *s.shape[1:])
        params = [relax.Var("x", relax.TensorType(shape, "float32"))]
        if s.two_inputs:
            params.append(relax.Var("y", relax.TensorType(shape, "float32")))
        self.shape = shape
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
                outs = outs or [vals[-1]]
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
