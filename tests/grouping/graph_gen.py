"""Random Relax graphs of mixed ops for fusion fuzzing (one seed -> one graph, reproducible).

``random_graph(seed)`` returns an IRModule with one ``main``: elementwise, broadcast, reductions with a
row epilogue, matmul (2-D family) or conv2d (4-D family), transposes, several consumers of one value and
sometimes two outputs. Values stay bounded (sigmoid/tanh, division only by sums of positives) so fp32
comparisons are meaningful. Reused by the 1000-graph fuzz run:

    for seed in range(1000): check(random_graph(seed))
"""

from __future__ import annotations

import numpy as np
from tvm import relax

UNARY = ("relu", "tanh", "sigmoid", "neg", "exp_tanh", "square_tanh")
BINARY = ("add", "multiply", "subtract", "maximum")


def _unary(kind, x):
    op = relax.op
    return {
        "relu": lambda: op.nn.relu(x),
        "tanh": lambda: op.tanh(x),
        "sigmoid": lambda: op.sigmoid(x),
        "neg": lambda: op.negative(x),
        "exp_tanh": lambda: op.exp(op.tanh(x)),
        "square_tanh": lambda: op.multiply(op.tanh(x), op.tanh(x)),
    }[kind]()


def random_graph(seed: int, max_ops: int = 10, small: bool = True):
    rng = np.random.default_rng(seed)
    family = "2d" if rng.random() < 0.5 else "4d"
    if family == "2d":
        m, n = (int(rng.choice([4, 8, 16])), int(rng.choice([8, 16, 32])))
        shape = (m, n)
    else:
        c, h = int(rng.choice([2, 4, 8])), int(rng.choice([4, 6, 8]))
        shape = (1, c, h, h)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    params = [x]
    if rng.random() < 0.5:
        params.append(relax.Var("y", relax.TensorType(shape, "float32")))
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            vals = list(params)
            n_ops = int(rng.integers(3, max_ops + 1))
            for _ in range(n_ops):
                a = vals[int(rng.integers(0, len(vals)))]
                r = rng.random()
                if r < 0.3:
                    v = bb.emit(_unary(str(rng.choice(UNARY)), a))
                elif r < 0.5:
                    b = vals[int(rng.integers(0, len(vals)))]
                    v = bb.emit(getattr(relax.op, str(rng.choice(BINARY)))(a, b))
                elif r < 0.6:   # broadcast bias along the last axis (or channels for 4-D)
                    bshape = (shape[-1],) if family == "2d" else (1, shape[1], 1, 1)
                    bias = relax.const(rng.standard_normal(bshape).astype("float32"))
                    v = bb.emit(relax.op.add(a, bias))
                elif r < 0.72:  # row reduction followed by its epilogue
                    if rng.random() < 0.5:
                        s = bb.emit(relax.op.sum(relax.op.sigmoid(a), axis=[-1], keepdims=True))
                        v = bb.emit(relax.op.divide(a, s))
                    else:
                        s = bb.emit(relax.op.max(a, axis=[-1], keepdims=True))
                        v = bb.emit(relax.op.subtract(a, s))
                elif r < 0.86:  # the cube op of the family (shape preserving)
                    if family == "2d":
                        k = shape[-1]
                        w = relax.const((rng.standard_normal((k, k)) / np.sqrt(k)).astype("float32"))
                        v = bb.emit(relax.op.matmul(a, w))
                    else:
                        c = shape[1]
                        w = relax.const((rng.standard_normal((c, c, 3, 3)) / (3 * np.sqrt(c))).astype("float32"))
                        v = bb.emit(relax.op.nn.conv2d(a, w, padding=[1, 1, 1, 1]))
                else:           # injective: transpose there and back (square trailing dims keep shapes)
                    axes = [1, 0] if family == "2d" else [0, 1, 3, 2]
                    if family == "2d" and shape[0] != shape[1]:
                        v = bb.emit(relax.op.permute_dims(relax.op.permute_dims(a, axes), axes))
                    else:
                        v = bb.emit(relax.op.permute_dims(a, axes))
                vals.append(v)
            outs = [vals[-1]]
            extra = [v for v in vals[len(params):-1]]
            if extra and rng.random() < 0.4:
                outs.append(extra[int(rng.integers(0, len(extra)))])
            res = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        bb.emit_func_output(res)
    return bb.get()
