"""Layout ops as index maps: what the canonicalising passes share.

A chain of pure layout ops (reshape, permute_dims, expand_dims, squeeze, flatten, strided_slice, split, take
with constant indices, broadcast_to) moves elements without computing anything, so its effect is fully
described by one integer array: applied to ``arange(size).reshape(source shape)`` with numpy, the chain gives,
for every element of its result, the flat index of the source element it holds (``index_map``). Two chains
with the same map are the same function, whatever ops they use.

``express`` goes the other way: from a map to the shortest chain of the one form the attention patterns and
the grouping know,

    strided_slice (one box of the source)  ->  reshape  ->  permute_dims  ->  reshape

(each step left out when it does nothing), or None when the map is no such chain (e.g. it repeats elements:
a broadcast). The result is checked by applying it to the index array again, so a wrong guess of the
factorisation can only mean "no canonical form", never a different function.

``const_ints`` evaluates the small integer computations exporters put in front of an index (``take`` of a
``shape_of``, wrapped by ``where(i < 0, i + n, i)``) when all they read is static.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict

import numpy as np
from tvm import relax

from ._graph import FunctionGraph, int_list, op_name, static_shape

# Layout ops whose numpy equivalent ``_apply`` knows; a TupleGetItem of a split counts as one.
LAYOUT_OPS = ("relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze", "relax.flatten",
              "relax.strided_slice", "relax.take", "relax.broadcast_to", "relax.split")

# Index arrays are built with numpy; chains over larger tensors are left alone (none of the exports we know
# has a layout chain over more elements than this on its activations).
MAX_ELEMENTS = 1 << 24


def is_layout(graph: FunctionGraph, expr) -> bool:
    """``expr`` is bound to a layout op (or to one part of a ``split``) that ``index_map`` can follow."""
    val = graph.value(expr)
    if isinstance(val, relax.TupleGetItem):
        return op_name(graph.value(val.tuple_value)) == "relax.split"
    name = op_name(val)
    if name not in LAYOUT_OPS or name == "relax.split":
        return False
    if name == "relax.take":
        return const_ints(graph, val.args[1]) is not None
    if name == "relax.strided_slice":
        return _slice_args(val) is not None
    return True


def layout_source(graph: FunctionGraph, expr):
    """The tensor a layout op (or split part) reads."""
    val = graph.value(expr)
    if isinstance(val, relax.TupleGetItem):
        return graph.value(val.tuple_value).args[0]
    return val.args[0]


def chain_to(graph: FunctionGraph, end, max_ops: int = 16, stop=None) -> tuple[object, list]:
    """(source, [layout vars from the source's first consumer to ``end``]) walking back from ``end`` through
    layout ops; ``stop(var)`` ends the walk early at ``var`` (it becomes the source)."""
    ops, cur = [], end
    while is_layout(graph, cur) and len(ops) < max_ops and not (stop and stop(cur)):
        ops.append(cur)
        cur = layout_source(graph, cur)
    return cur, list(reversed(ops))


def index_map(graph: FunctionGraph, source, ops: list) -> np.ndarray | None:
    """Flat source index of every element of the chain's result (``ops`` as from ``chain_to``), None when a
    shape is not static or the tensors are too large."""
    shape = static_shape(source)
    if shape is None or math.prod(shape) > MAX_ELEMENTS:
        return None
    arr = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    for var in ops:
        arr = _apply(graph, var, arr)
        if arr is None:
            return None
    return arr


def chain_signature(graph: FunctionGraph, source, ops: list) -> tuple | None:
    """Everything ``index_map`` of the chain depends on, without the tensors: the source shape and, per op,
    its kind, result shape and constant arguments. Equal signatures give equal maps (a model's layers repeat
    the same chains: every Transformer layer its head split and merge), so a map need only be built and
    expressed once per signature. None when a shape is not static."""
    shape = static_shape(source)
    if shape is None:
        return None
    parts = [tuple(shape)]
    for var in ops:
        out_shape = static_shape(var)
        if out_shape is None:
            return None
        val = graph.value(var)
        if isinstance(val, relax.TupleGetItem):
            split = graph.value(val.tuple_value)
            key = ("split", int(split.attrs.axis), str(split.attrs.indices_or_sections), int(val.index))
        else:
            name = op_name(val)
            if name == "relax.permute_dims":
                key = (name, None if val.attrs.axes is None else tuple(int_list(val.attrs.axes)))
            elif name == "relax.strided_slice":
                args = _slice_args(val)
                key = (name, None if args is None else tuple(tuple(a) for a in args))
            elif name == "relax.take":
                idx = const_ints(graph, val.args[1])
                key = (name, None if idx is None else (idx.shape, idx.tobytes()), str(val.attrs.axis),
                       str(val.attrs.mode))
            else:
                key = (name,)
        parts.append((key, tuple(out_shape)))
    return tuple(parts)


# ``express_chain`` results by chain signature
_CHAINS: OrderedDict = OrderedDict()


def express_chain(graph: FunctionGraph, source, ops: list) -> "Layout | None":
    """``express`` of the chain's ``index_map``, looked up by ``chain_signature`` first: a repeated chain
    costs neither the index array nor its digest."""
    sig = chain_signature(graph, source, ops)
    if sig is not None and sig in _CHAINS:
        _CHAINS.move_to_end(sig)
        return _CHAINS[sig]
    m = index_map(graph, source, ops)
    layout = None if m is None else express(static_shape(source), m)
    if sig is not None:
        _CHAINS[sig] = layout
        if len(_CHAINS) > EXPRESSED_KEPT:
            _CHAINS.popitem(last=False)
    return layout


def _apply(graph, var, arr):
    out_shape = static_shape(var)
    if out_shape is None or math.prod(out_shape) > MAX_ELEMENTS:
        return None
    val = graph.value(var)
    if isinstance(val, relax.TupleGetItem):
        split = graph.value(val.tuple_value)
        axis = int(split.attrs.axis) % arr.ndim
        sec = split.attrs.indices_or_sections
        try:
            sec = int(sec)                              # a number of equal sections
        except (TypeError, ValueError):
            sec = int_list(sec)                         # split points
        if sec is None:
            return None
        parts = np.split(arr, sec, axis=axis)
        res = parts[int(val.index)]
    else:
        name = op_name(val)
        if name == "relax.permute_dims":
            axes = int_list(val.attrs.axes) if val.attrs.axes is not None else None
            res = np.transpose(arr, axes)
        elif name in ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten"):
            res = arr.reshape(out_shape)
        elif name == "relax.strided_slice":
            res = arr[_slices(_slice_args(val), arr.ndim)]
        elif name == "relax.take":
            idx = const_ints(graph, val.args[1])
            axis = int(val.attrs.axis) % arr.ndim if val.attrs.axis is not None else None
            if axis is None:
                return None
            n = arr.shape[axis]
            if str(val.attrs.mode) == "clip":
                idx = np.clip(idx, 0, n - 1)
            else:       # wrap, and fast (in range by contract): negative indices count from the end
                idx = np.mod(idx, n)
            res = np.take(arr, idx, axis=axis)
        elif name == "relax.broadcast_to":
            try:
                res = np.broadcast_to(arr, out_shape)
            except ValueError:
                return None
        else:
            return None
    return res if tuple(res.shape) == tuple(out_shape) else None


def _slice_args(call):
    """(axes, begin, end, strides) of a strided_slice with constant arguments and positive strides."""
    args = [int_list(a) for a in call.args[1:5]]
    if any(a is None for a in args[:3]):
        return None
    axes, begin, end = args[:3]
    strides = args[3] if len(args) > 3 and args[3] is not None else [1] * len(axes)
    if any(s <= 0 for s in strides):
        return None
    return axes, begin, end, strides


def _slices(args, ndim):
    axes, begin, end, strides = args
    sl = [slice(None)] * ndim
    for a, b, e, s in zip(axes, begin, end, strides):
        sl[a % ndim] = slice(b, e, s)
    return tuple(sl)


def const_ints(graph: FunctionGraph, expr, depth: int = 0) -> np.ndarray | None:
    """The value of a small integer expression (constants, ``shape_of`` of a static tensor and simple
    arithmetic on them), else None."""
    if depth > 12:
        return None
    arr = graph.const(expr)
    if arr is not None:
        return arr if arr.dtype.kind in "iub" and arr.size <= 4096 else None
    val = graph.value(expr)
    name = op_name(val)
    sub = lambda e: const_ints(graph, e, depth + 1)   # noqa: E731
    if name == "relax.shape_to_tensor":
        inner = graph.value(val.args[0])
        if op_name(inner) == "relax.shape_of":
            shape = static_shape(inner.args[0])
            return None if shape is None else np.array(shape, dtype=np.int64)
        if isinstance(val.args[0], relax.ShapeExpr):
            return np.array(int_list(val.args[0]), dtype=np.int64)
        return None
    if name in ("relax.take",):
        data, idx = sub(val.args[0]), sub(val.args[1])
        if data is None or idx is None:
            return None
        axis = int(val.attrs.axis) if val.attrs.axis is not None else 0
        return np.take(data, np.mod(idx, data.shape[axis]), axis=axis)
    binary = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
              "relax.less": np.less, "relax.greater": np.greater, "relax.less_equal": np.less_equal,
              "relax.greater_equal": np.greater_equal, "relax.equal": np.equal}
    if name in binary:
        a, b = sub(val.args[0]), sub(val.args[1])
        return None if a is None or b is None else binary[name](a, b)
    if name == "relax.where":
        c, a, b = (sub(x) for x in val.args)
        return None if c is None or a is None or b is None else np.where(c, a, b)
    if name in ("relax.astype", "relax.reshape", "relax.squeeze", "relax.expand_dims"):
        a = sub(val.args[0])
        shape = static_shape(expr)
        if a is None or shape is None:
            return None
        a = a.reshape(shape)
        return a.astype(str(val.attrs.dtype)) if name == "relax.astype" else a
    return None


# ---- the canonical form -----------------------------------------------------------------------------------
class Layout:
    """A canonical chain: ``box`` (per-axis (begin, end) of the source, None when whole), then ``reshape``
    (None: none), ``permute`` (None: none), ``final`` (None: none)."""

    def __init__(self, src_shape, box, reshape, permute, final):
        self.src_shape, self.box, self.reshape, self.permute, self.final = src_shape, box, reshape, permute, final

    @property
    def ops(self) -> int:
        return sum(x is not None for x in (self.box, self.reshape, self.permute, self.final))

    def apply_np(self, arr: np.ndarray) -> np.ndarray:
        if self.box is not None:
            arr = arr[tuple(slice(b, e) for b, e in self.box)]
        if self.reshape is not None:
            arr = arr.reshape(self.reshape)
        if self.permute is not None:
            arr = np.transpose(arr, self.permute)
        if self.final is not None:
            arr = arr.reshape(self.final)
        return arr

    def emit(self, x: relax.Expr) -> relax.Expr:
        if self.box is not None:
            axes = [a for a, (b, e) in enumerate(self.box) if (b, e) != (0, self.src_shape[a])]
            x = relax.op.strided_slice(x, axes=axes, begin=[self.box[a][0] for a in axes],
                                       end=[self.box[a][1] for a in axes])
        if self.reshape is not None:
            x = relax.op.reshape(x, self.reshape)
        if self.permute is not None:
            x = relax.op.permute_dims(x, self.permute)
        if self.final is not None:
            x = relax.op.reshape(x, self.final)
        return x


# ``express`` results by (source shape, map shape, digest of the map): a model's layers repeat the same
# chains (every Transformer layer its head split and merge), each a pass over the whole activation.
_EXPRESSED: OrderedDict = OrderedDict()
EXPRESSED_KEPT = 512


def express(src_shape, m: np.ndarray) -> Layout | None:
    """The canonical chain taking a tensor of ``src_shape`` to the result whose flat source indices are
    ``m`` (see the module docstring), or None."""
    src_shape = tuple(int(d) for d in src_shape)
    m = np.asarray(m)
    key = (src_shape, m.shape, m.dtype.str,
           hashlib.blake2b(np.ascontiguousarray(m).data, digest_size=20).digest())
    if key in _EXPRESSED:
        _EXPRESSED.move_to_end(key)
        return _EXPRESSED[key]
    layout = _express(src_shape, m)
    _EXPRESSED[key] = layout
    if len(_EXPRESSED) > EXPRESSED_KEPT:
        _EXPRESSED.popitem(last=False)
    return layout


def _express(src_shape: tuple, m: np.ndarray) -> Layout | None:
    flat = m.reshape(-1)
    if flat.size == 0 or flat.size > math.prod(src_shape) or _repeats(flat, math.prod(src_shape)):
        return None                                    # repeats elements (a broadcast): not a layout chain
    # 1. the box of the source the result covers: in a box, the smallest flat index is its first corner and
    # the largest its last (strides are positive), so two elements give it; a map that is no box then fails
    # the size check or the final check below, which compares every element
    lo = [int(c) for c in np.unravel_index(int(flat.min()), src_shape)]
    hi = [int(c) + 1 for c in np.unravel_index(int(flat.max()), src_shape)]
    box_shape = tuple(h - l for l, h in zip(lo, hi))
    if min(box_shape) < 1 or math.prod(box_shape) != flat.size:
        return None                                    # not one box (e.g. every other element)
    box = None if box_shape == src_shape else list(zip(lo, hi))
    # 2. each result axis as strided factors of the box's flat index, read off one line of the map along it
    refined = []                                       # (result axis, size, stride), outer to inner
    for a, n in enumerate(m.shape):
        if n == 1:
            continue
        coords = np.unravel_index(m[tuple(slice(None) if i == a else 0 for i in range(m.ndim))], src_shape)
        if any(int(c.min()) < l or int(c.max()) >= h for c, l, h in zip(coords, lo, hi)):
            return None
        line = np.ravel_multi_index(tuple(c - l for c, l in zip(coords, lo)), box_shape)
        line = line - line[0]
        factors = _factors(line)
        if factors is None:
            return None
        refined += [(a, size, stride) for size, stride in factors]
    # 3. the source order of the factors (strides descending) must be a contiguous reshape of the box
    order = sorted(range(len(refined)), key=lambda i: -refined[i][2])
    expect = 1
    for i in reversed(order):
        if refined[i][2] != expect:
            return None
        expect *= refined[i][1]
    if expect != flat.size:
        return None
    # unit result axes go first, in result order, so that a head split keeps the result's rank
    units = [a for a, n in enumerate(m.shape) if n == 1]
    z_shape = [1] * len(units) + [refined[i][1] for i in order]
    z_pos = {("u", a): k for k, a in enumerate(units)}
    z_pos.update({("r", i): len(units) + k for k, i in enumerate(order)})
    perm, refined_shape, ri = [], [], 0
    for a, n in enumerate(m.shape):
        if n == 1:
            perm.append(z_pos[("u", a)])
            refined_shape.append(1)
            continue
        while ri < len(refined) and refined[ri][0] == a:
            perm.append(z_pos[("r", ri)])
            refined_shape.append(refined[ri][1])
            ri += 1
    reshape = None if tuple(z_shape) == box_shape else tuple(z_shape)
    if perm == list(range(len(perm))):
        permute, inner = None, tuple(z_shape)
    else:
        permute, inner = perm, tuple(z_shape[p] for p in perm)
    final = None if inner == tuple(m.shape) else tuple(int(d) for d in m.shape)
    if permute is None and reshape is not None and final is not None:
        reshape, final = tuple(int(d) for d in m.shape), None     # two reshapes in a row are one
    if permute is None and reshape is not None and reshape == box_shape:
        reshape = None
    layout = Layout(src_shape, box, reshape, permute, final)
    # the check: the chain applied to the source's flat indices gives the map (built for the box only: the
    # slice of a head out of a merged projection need not index the whole projection)
    strides = [math.prod(src_shape[a + 1:]) for a in range(len(src_shape))]
    cut = np.zeros(box_shape, dtype=np.int64)
    for a, (l, h) in enumerate(zip(lo, hi)):
        cut += (np.arange(l, h, dtype=np.int64) * strides[a]).reshape([-1 if b == a else 1 for b in range(len(lo))])
    got = Layout(box_shape, None, reshape, permute, final).apply_np(cut)
    if got.shape != m.shape or not np.array_equal(got, m):
        return None
    return layout


def _repeats(flat: np.ndarray, size: int) -> bool:
    """Whether some source index in [0, size) occurs twice in ``flat``. A mark per source element, O(n):
    ``np.unique`` sorts or hashes, and on a Whisper-sized encoder (1500 x 384 activations, a few dozen
    chains) that alone was most of the model's compile time."""
    seen = np.zeros(size, dtype=bool)
    seen[flat] = True
    return int(np.count_nonzero(seen)) != flat.size


def _factors(line: np.ndarray):
    """(size, stride) factors, outer to inner, with ``line[t] == sum(digit_k(t) * stride_k)`` in the mixed
    radix of the sizes, or None."""
    n = line.size
    out = []
    while n > 1:
        stride = int(line[1])
        if stride <= 0:
            return None
        run = 1
        while run < n and line[run] == run * stride:
            run += 1
        run = max(d for d in range(1, run + 1) if n % d == 0)
        block = line.reshape(n // run, run)
        if not np.array_equal(block, block[:, :1] + np.arange(run) * stride):
            return None
        out.append((run, stride))
        line = block[:, 0]
        n = line.size
    return list(reversed(out))


def row_map(m: np.ndarray, k: int) -> np.ndarray | None:
    """For a map whose result keeps the source's last axis (length ``k``) whole and in order: the flat source
    row of every result row (shape ``m.shape[:-1]``); else None."""
    if m.ndim == 0 or m.shape[-1] != k:
        return None
    base = m[..., :1]
    if not np.array_equal(m, base + np.arange(k)) or np.any(base % k):
        return None
    return (base[..., 0] // k)


def rows_layout(rows_shape, rmap: np.ndarray, k: int) -> Layout | None:
    """The canonical chain that arranges the rows (last axis ``k`` kept) of a tensor whose leading dims are
    ``rows_shape`` as ``rmap`` says."""
    m = rmap[..., None] * k + np.arange(k)
    return express(tuple(rows_shape) + (k,), m)
