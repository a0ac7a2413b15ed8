"""ONNX import with symbolic dimensions kept symbolic (``import_onnx``'s importer when shape folding is on).

A model exported with a symbolic dimension (an LLM decode step whose KV cache length ``past`` is a
``torch.export.Dim``) computes sizes, positions and masks from ``Shape(past_k)``: ``Shape -> Squeeze ->
Add(arange, .) -> Unsqueeze -> Cast`` (the rotary position), ``Range(0, past + 1)`` (the key positions),
``Reshape(past + 1, [-1]) -> Concat -> Expand`` (the causal mask's shape). ``onnx_shapes.fold_shapes`` cannot
fold these (they are not constants) and TVM 0.27's importer mishandles them:

* its binary ops treat a value computed from a symbolic size as a scalar whatever its ONNX shape
  (``Add([0], past)`` becomes the rank-0 ``past``), so the next ``Unsqueeze(axes=[0, 1])`` fails with
  "Unsqueeze axis 1 is out of range for rank 1";
* ``Unsqueeze`` of such a scalar supports axis 0 only, and ops other than a few shape ops refuse a
  ``ShapeExpr`` input ("cannot handle ShapeExpr inputs") instead of using its values;
* ``Range`` with a symbolic limit gets a fresh length variable (``range_len_0``) that is not ``past + 1``,
  so the mask no longer has the score's shape.

``SymbolicShapeImporter`` evaluates these integer computations itself, at import time, with TVM's symbolic
arithmetic: every ONNX value computed from a symbolic size is kept as an array (its ONNX shape) of
``tirx`` expressions in ``past``. The importer then hands TVM's converters the form each use needs:

* a shape argument (``Reshape``/``Expand`` target, ``ConstantOfShape``, ``Slice`` bounds) gets a
  ``ShapeExpr`` or ``PrimExpr`` with the symbolic values, so the result has a symbolic shape;
* any other use (the value as data: a position, a compared index) gets an int64 tensor of the ONNX shape
  built from the values (``shape_to_tensor``), once per value;
* a ``Range`` with symbolic bounds becomes ``arange(start, limit, delta)``, whose length is the symbolic
  expression (``past + 1``), not a new variable.

Nothing of TVM's is changed: the importer is a subclass used only by ``import_onnx``, and every node the
symbolic evaluation does not take is converted by TVM's own converter, except the ops TVM's convert map
lacks, which this importer adds: ``LSTM``, ``GRU`` and ``RNN`` (``onnx_recurrent``).
"""

from __future__ import annotations

import numpy as np
import onnx
import tvm
from tvm import relax, sym, tirx
from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

from .onnx_recurrent import CONVERTERS as _RECURRENT
from .onnx_shapes import MAX_ELEMENTS, _attr, _evaluate

_DEFAULT_DOMAINS = ("", "ai.onnx")

# Ops that only move elements: evaluated on an array of element positions with ONNX's reference runtime,
# then the positions are replaced by the symbolic values. Value -> which inputs carry data.
_MOVES = {"Gather": (0,), "Slice": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Reshape": (0,),
          "Identity": (0,), "Transpose": (0,), "Flatten": (0,), "Expand": (0,), "Tile": (0,),
          "Concat": None}      # None: every input
_ARITH = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
          "Div": lambda a, b: tirx.truncdiv(a, b) if _is_expr(a) or _is_expr(b) else _truncdiv(a, b),
          "Mod": lambda a, b: tirx.floormod(a, b) if _is_expr(a) or _is_expr(b) else a % b,
          "Max": lambda a, b: tirx.max(a, b) if _is_expr(a) or _is_expr(b) else max(a, b),
          "Min": lambda a, b: tirx.min(a, b) if _is_expr(a) or _is_expr(b) else min(a, b)}
# comparisons as tirx nodes (Python's == on a PrimExpr is structural equality, not a condition)
_COMPARE = {"Equal": tirx.EQ, "Less": tirx.LT, "LessOrEqual": tirx.LE, "Greater": tirx.GT,
            "GreaterOrEqual": tirx.GE}
_INT_DTYPES = ("int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8")

# (op, input index) where TVM's converter reads a ShapeExpr / PrimExpr as the values it stands for.
_SHAPE_ARGS = {"Reshape": (1,), "Expand": (1,), "ConstantOfShape": (0,), "Slice": (1, 2, 3, 4)}


def _is_expr(v) -> bool:
    return tvm.ir.is_prim_expr(v) and not isinstance(v, tirx.IntImm)


class _OneNode:
    """A graph of one node (or of ``of(nodes)``), for ``ONNXGraphImporter._construct_nodes`` and
    ``_check_for_unsupported_ops`` (they read ``graph.node`` only)."""

    def __init__(self, node):
        self.node = [node]

    @classmethod
    def of(cls, nodes):
        graph = cls(None)
        graph.node = list(nodes)
        return graph


class SymbolicShapeImporter(ONNXGraphImporter):
    """TVM's ONNX importer, with integer computations on symbolic sizes evaluated symbolically (see the
    module's docstring)."""

    def __init__(self, shape_dict=None, dtype_dict="float32"):
        super().__init__(shape_dict, dtype_dict)
        self._sym: dict[str, tuple[np.ndarray, str]] = {}      # name -> (object array of int | PrimExpr, dtype)
        self._tensor_of: dict[str, relax.Expr] = {}             # name -> the value built as a tensor
        self._analyzer = sym.Analyzer()
        self._bounded: set = set()

    # -- converters TVM's map lacks (LSTM, GRU, RNN: onnx_recurrent) --------------------------------------
    def _check_for_unsupported_ops(self, graph):
        known = [n for n in graph.node if n.op_type not in _RECURRENT or n.domain not in _DEFAULT_DOMAINS]
        super()._check_for_unsupported_ops(_OneNode.of(known))

    def _convert_operator(self, op_name, inputs, attrs, opset):
        if op_name in _RECURRENT:
            out = _RECURRENT[op_name].get_converter(opset)(self.bb, inputs, attrs, [self._nodes, self._params])
            return self.bb.normalize(out)
        return super()._convert_operator(op_name, inputs, attrs, opset)

    # -- the node loop ------------------------------------------------------------------------------------
    def _construct_nodes(self, graph):
        for node in graph.node:
            if node.domain in _DEFAULT_DOMAINS and (self._evaluate(node) or self._range(node)):
                continue
            swapped = self._prepare_inputs(node)
            try:
                super()._construct_nodes(_OneNode(node))
            finally:
                for name, value in swapped.items():
                    self._nodes[name] = value
        # a graph output computed symbolically is returned as a tensor
        for out in getattr(graph, "output", []):
            if out.name in self._sym:
                self._nodes[out.name] = self._as_tensor(out.name)

    def _prepare_inputs(self, node) -> dict:
        """Give TVM's converter a tensor for each symbolic input it uses as data; the stored form
        (ShapeExpr/PrimExpr) stays for shape arguments. Returns what was replaced, to put back."""
        swapped = {}
        shape_args = _SHAPE_ARGS.get(node.op_type, ())
        for i, name in enumerate(node.input):
            if not name or name not in self._sym or name in swapped:
                continue
            # one value read both as a shape and as data by one node (never seen) is given as data
            if i in shape_args and list(node.input).count(name) == 1:
                if node.op_type == "Reshape":
                    swapped[name] = self._nodes[name]
                    self._nodes[name] = self._reshape_target(node, name)
                continue
            swapped[name] = self._nodes[name]
            self._nodes[name] = self._as_tensor(name)
        return swapped

    def _reshape_target(self, node, name) -> relax.Expr:
        """A symbolic Reshape target with ONNX's 0 (copy the input's size, unless ``allowzero``) and -1 (the
        rest) replaced by the sizes they stand for, so the result's shape is explicit."""
        values, _ = self._sym[name]
        data = self._nodes.get(node.input[0])
        dims = _static_or_symbolic_dims(data)
        target = list(values.reshape(-1))
        if dims is None or values.ndim != 1:
            return self._stored(name)
        if not _attr(node, "allowzero", 0):
            target = [dims[i] if _is_int(v) and int(v) == 0 and i < len(dims) else v for i, v in enumerate(target)]
        unknown = [i for i, v in enumerate(target) if _is_int(v) and int(v) == -1]
        if len(unknown) == 1:
            total = _product(dims)
            rest = _product([v for i, v in enumerate(target) if i != unknown[0]])
            target[unknown[0]] = self._simplify(tirx.floordiv(_prim(total), _prim(rest)))
        return relax.ShapeExpr([_prim(v) for v in target])

    # -- symbolic evaluation --------------------------------------------------------------------------------
    def _known(self, name):
        """(values, dtype) of an input known at import time: symbolic, or a small integer/bool constant."""
        if name in self._sym:
            return self._sym[name]
        value = self._nodes.get(name)
        if isinstance(value, tvm.ir.GenericConst):
            dtype = str(value.ty.dtype)
            if dtype in _INT_DTYPES or dtype == "bool":
                array = value.value.numpy()
                if array.size <= MAX_ELEMENTS:
                    return array.astype(object), dtype
        return None

    def _evaluate(self, node) -> bool:
        op = node.op_type
        if op in ("Shape", "Size"):
            return self._shape_of(node)
        if not any(i in self._sym for i in node.input if i):
            return False     # nothing symbolic: TVM's converter (or the static folding before it) does it
        inputs = [self._known(i) if i else None for i in node.input]
        if any(i and v is None for i, v in zip(node.input, inputs)):
            return False     # a tensor input: the value is data, not a size
        try:
            if op in _MOVES:
                result = self._move(node, inputs)
            elif op in _ARITH and len(inputs) == 2:
                result = self._elementwise(_ARITH[op], inputs[0][0], inputs[1][0]), inputs[0][1]
            elif op == "Neg":
                result = self._elementwise(lambda a: -a, inputs[0][0]), inputs[0][1]
            elif op == "Abs":
                result = self._elementwise(lambda a: tirx.abs(a) if _is_expr(a) else abs(a), inputs[0][0]), \
                    inputs[0][1]
            elif op == "Cast":
                dtype = onnx.helper.tensor_dtype_to_np_dtype(_attr(node, "to")).name
                if dtype not in _INT_DTYPES:
                    return False     # a size made a float is data (the rotary position): built as a tensor
                result = inputs[0][0], dtype
            elif op in _COMPARE:
                result = self._elementwise(lambda a, b: self._decide(_COMPARE[op](_prim(a), _prim(b))),
                                           inputs[0][0], inputs[1][0]), "bool"
            elif op == "Where":
                cond = inputs[0][0]
                if any(not isinstance(c, (bool, np.bool_)) for c in cond.reshape(-1)):
                    return False
                result = self._elementwise(lambda c, a, b: a if c else b, cond, inputs[1][0], inputs[2][0]), \
                    inputs[1][1]
            else:
                return False
        except _Undecided:
            return False
        if result is None or result[0] is None:
            return False
        self._store(node.output[0], *result)
        return True

    def _shape_of(self, node) -> bool:
        data = self._nodes.get(node.input[0])
        dims = _static_or_symbolic_dims(data)
        if dims is None or not any(_is_expr(d) for d in dims):
            return False
        for d in dims:
            self._bound(d)
        if node.op_type == "Size":
            size = np.empty((), dtype=object)
            size[()] = self._simplify(_product(dims))
            self._store(node.output[0], size, "int64")
        else:
            start, end = _attr(node, "start", 0), _attr(node, "end", None)
            picked = dims[start:end]
            self._store(node.output[0], _object_array(picked), "int64")
        return True

    def _move(self, node, inputs):
        """A data-movement op on symbolic values: run it on element positions, then pick the values."""
        data_idx = _MOVES[node.op_type]
        data_idx = range(len(inputs)) if data_idx is None else data_idx
        pool, consts, offset = [], {}, 0
        for i, (name, known) in enumerate(zip(node.input, inputs)):
            if not name:
                continue
            values, _ = known
            if i in data_idx:
                consts[name] = np.arange(offset, offset + values.size, dtype=np.int64).reshape(values.shape)
                pool.extend(values.reshape(-1).tolist())
                offset += values.size
            elif name in self._sym:
                return None      # a symbolic index/axis/shape argument: not evaluated here
            else:
                consts[name] = values.astype(_np_dtype(known[1]))
        out = _evaluate(node, self.opset, consts)
        if out is None:
            return None
        positions = out[0]
        picked = np.empty(positions.shape, dtype=object)
        for idx, p in np.ndenumerate(positions):
            picked[idx] = pool[int(p)]
        return picked, inputs[data_idx[0]][1]

    def _range(self, node) -> bool:
        """Range with symbolic bounds as ``arange``: its length is the symbolic expression itself."""
        if node.op_type != "Range" or not any(i in self._sym for i in node.input):
            return False
        known = [self._known(i) for i in node.input]
        if any(k is None or k[0].size != 1 for k in known) or known[0][1] not in _INT_DTYPES:
            return False     # float ranges and tensor bounds: TVM's converter
        start, limit, delta = (_prim(k[0].reshape(-1)[0]) for k in known)
        if not isinstance(delta, tirx.IntImm) or int(delta) == 0:
            return False
        out = self.bb.normalize(relax.op.arange(start, limit, delta, known[0][1]))
        self._nodes[node.output[0]] = out
        return True

    def _elementwise(self, fn, *arrays):
        out = np.frompyfunc(fn, len(arrays), 1)(*arrays)
        out = np.asarray(out, dtype=object)
        for idx, v in np.ndenumerate(out):
            out[idx] = self._simplify(v)
        return out

    def _decide(self, cond):
        if isinstance(cond, (bool, np.bool_)):
            return bool(cond)
        if self._analyzer.can_prove(cond):
            return True
        if self._analyzer.can_prove(tirx.Not(cond)):
            return False
        raise _Undecided()

    def _bound(self, dim) -> None:
        """Sizes are never negative: tell the analyzer, so ``(past + 1) * 64 / 64`` simplifies."""
        for var in _vars_of(dim):
            if var not in self._bounded:
                self._bounded.add(var)
                self._analyzer.update(var, sym.ConstIntBound(0, sym.ConstIntBound.POS_INF))

    def _simplify(self, v):
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
        if isinstance(v, (int, np.integer)):
            return int(v)
        v = self._analyzer.simplify(v)
        return int(v.value) if isinstance(v, tirx.IntImm) else v

    # -- storing and building ------------------------------------------------------------------------------
    def _store(self, name, values, dtype) -> None:
        values = np.asarray(values, dtype=object)
        for idx, v in np.ndenumerate(values):
            values[idx] = self._simplify(v)
        if all(not _is_expr(v) for v in values.reshape(-1)):
            self._sym.pop(name, None)
            self._nodes[name] = relax.const(values.astype(_np_dtype(dtype)), dtype)
            return
        self._sym[name] = (values, dtype)
        self._nodes[name] = self._stored(name)

    def _stored(self, name) -> relax.Expr:
        """The form TVM's shape-reading converters take: a scalar PrimExpr, a ShapeExpr for a vector; a
        value of another rank is a tensor."""
        values, dtype = self._sym[name]
        if values.ndim == 0:
            return _prim(values.item())
        if values.ndim == 1 and dtype in _INT_DTYPES:
            return relax.ShapeExpr([_prim(v) for v in values])
        return self._as_tensor(name)

    def _as_tensor(self, name) -> relax.Expr:
        """The symbolic value as an int tensor of its ONNX shape and type (built once)."""
        if name not in self._tensor_of:
            values, dtype = self._sym[name]
            flat = [_prim(v) for v in values.reshape(-1)]
            flat = [tirx.Cast("int64", v) if str(v.ty) != "int64" else v for v in flat]
            t = self.bb.normalize(relax.op.shape_to_tensor(relax.ShapeExpr(flat)))
            if values.shape != (len(flat),):
                t = self.bb.normalize(relax.op.reshape(t, list(values.shape)))
            if dtype != "int64":
                t = self.bb.normalize(relax.op.astype(t, dtype))
            self._tensor_of[name] = t
        return self._tensor_of[name]


class _Undecided(Exception):
    """A comparison of symbolic sizes the analyzer cannot decide at import time."""


def _truncdiv(a: int, b: int) -> int:
    """ONNX's integer Div rounds toward zero (C semantics), not down as Python's // does."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) or isinstance(v, tirx.IntImm)


def _prim(v):
    if isinstance(v, (bool, np.bool_)):
        return tirx.const(int(v), "int64")
    if isinstance(v, (int, np.integer)):
        return tirx.const(int(v), "int64")
    return v


def _product(values):
    out = 1
    for v in values:
        out = out * v
    return out


def _object_array(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _np_dtype(dtype: str):
    return np.bool_ if dtype == "bool" else np.dtype(dtype)


def _static_or_symbolic_dims(expr) -> list | None:
    """The dims of a tensor's type: ints for static ones, PrimExprs for symbolic ones; None if unknown."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return [int(d.value) if isinstance(d, tirx.IntImm) else d for d in ty.shape.values]


def _vars_of(expr) -> list:
    return list(tirx.analysis.undefined_vars(expr)) if _is_expr(expr) else []


def from_onnx(model: onnx.ModelProto, shape_dict: dict | None = None):
    """``tvm.relax.frontend.onnx.from_onnx`` with ``SymbolicShapeImporter`` (the model is checked already)."""
    opset = next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), 1)
    return SymbolicShapeImporter(shape_dict, "float32").from_onnx(model.graph, opset)
