"""Shape folding on the ONNX graph, before TVM's importer sees it (``import_onnx(fold_shapes=True)``).

Exporters compute reshape targets, slice bounds and pad widths from ``Shape(x)``: torchvision's Swin-T writes
``x.view(B, H // ws, ws, W // ws, ws, C)`` as ``Shape -> Gather -> Div -> Unsqueeze -> Concat -> Reshape`` and
its window padding as ``Pad`` with pads computed the same way. TVM's importer converts each such node to a
run-time computation; a ``Pad`` or ``Slice`` whose bounds are run-time values gets an output of unknown
shape, and the next ``Reshape`` with a ``-1`` fails inside the importer ("Reshape expects the input tensor
to have known shape when there is some dimension length to infer"), before any Relax pass can run.

When the model's input shapes are static, all of these values are known at compile time. ``fold_shapes``
walks the nodes in order, keeping every value's type (ONNX's own per-node shape inference, fed with the
values folded so far), and replaces by a ``Constant``:

* ``Shape`` / ``Size`` of a tensor whose shape is static;
* a deterministic op of the default domain without subgraphs whose inputs are all constants, evaluated with
  ONNX's reference implementation (``onnx.reference``), when every output has at most ``MAX_ELEMENTS``
  elements (shape arithmetic is a handful; weights are not touched, TVM folds those after legalization).

The graph keeps its node names and outputs; values are the ones ONNX defines, computed at import time. A
model whose shapes depend on a symbolic input dimension keeps those computations. Switched off
(``fold_shapes=False``, ``ascendfuse compile --no-shape-folding``) the model is imported as TVM would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MAX_ELEMENTS = 4096

# Ops whose value is not a function of their inputs.
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli", "Dropout"}
_DEFAULT_DOMAINS = ("", "ai.onnx")
# Ops left to the importer even on constant inputs: a quantized weight stays int8 with its scales, so the
# int8 graph passes can read them (folded here it would reach them as float32 with the scales lost).
_KEPT = {"DequantizeLinear"}


@dataclass
class ShapeFolding:
    """What ``fold_shapes`` did: nodes replaced by constants, per op type."""

    folded: dict = field(default_factory=dict)      # op type -> nodes folded
    shape_ops: int = 0                              # Shape/Size nodes of static tensors among them

    @property
    def total(self) -> int:
        return sum(self.folded.values())

    def as_dict(self) -> dict:
        return {"nodes_folded": self.total, "shape_of_static_tensors": self.shape_ops,
                "by_op": dict(sorted(self.folded.items()))}


def _static_dims(ty: onnx.TypeProto | None) -> list[int] | None:
    if ty is None or not ty.HasField("tensor_type") or not ty.tensor_type.HasField("shape"):
        return None
    dims = ty.tensor_type.shape.dim
    if not all(d.HasField("dim_value") for d in dims):
        return None
    return [d.dim_value for d in dims]


def _known_dims(ty: onnx.TypeProto | None) -> list | None:
    """Per-axis sizes, None for a symbolic axis; None when the rank is unknown."""
    if ty is None or not ty.HasField("tensor_type") or not ty.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in ty.tensor_type.shape.dim]


def _pick_static(node, dims: list, consts: dict, opset: int) -> list | None:
    """Gather/Slice over a shape with symbolic entries, folded when it picks only static ones (``x.shape[2]``
    of a tensor whose batch is symbolic). The op runs on the shape with -1 in the symbolic places, and the
    result is kept only if no -1 was picked."""
    marked = np.array([-1 if d is None else d for d in dims], dtype=np.int64)
    picked = np.array([0 if d is None else 1 for d in dims], dtype=np.int64)
    out = _evaluate(node, opset, {**consts, node.input[0]: marked})
    mask = _evaluate(node, opset, {**consts, node.input[0]: picked})
    if out is None or mask is None or not np.all(mask[0] == 1):
        return None
    return out


def _type_of(array: np.ndarray, name: str) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape))


def _const_node(name: str, array: np.ndarray, like: onnx.NodeProto) -> onnx.NodeProto:
    node = helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name),
                            name=(like.name + "_folded") if like.name else "")
    return node


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _foldable(node: onnx.NodeProto) -> bool:
    return (node.domain in _DEFAULT_DOMAINS and node.op_type not in _NONDETERMINISTIC and node.op_type not in _KEPT
            and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute))


def fold_shapes(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, ShapeFolding]:
    """A copy of ``proto`` with static shape computations folded to constants, and what was folded."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    graph = model.graph
    summary = ShapeFolding()
    opset = next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), None)
    if opset is None:
        return model, summary
    opset_imports = list(model.opset_import)

    types: dict[str, onnx.TypeProto] = {}
    try:   # a first whole-graph inference gives the types of values we cannot compute (weights' consumers)
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
        for vi in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
            types[vi.name] = vi.type
    except Exception:  # noqa: BLE001 - inference is a help here, not a requirement
        for vi in list(graph.input) + list(graph.value_info):
            types[vi.name] = vi.type
    consts: dict[str, np.ndarray] = {}
    for init in graph.initializer:
        types[init.name] = helper.make_tensor_type_proto(init.data_type, list(init.dims))
        if int(np.prod(init.dims)) <= MAX_ELEMENTS and init.data_type != TensorProto.STRING:
            consts[init.name] = numpy_helper.to_array(init)

    partial: dict[str, list] = {}    # Shape outputs with symbolic dims: known entries, None for the others
    new_nodes = []
    for node in graph.node:
        values = None
        if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS:
            value = _attr(node, "value")
            if isinstance(value, TensorProto) and int(np.prod(value.dims)) <= MAX_ELEMENTS \
                    and value.data_type != TensorProto.STRING:
                consts[node.output[0]] = numpy_helper.to_array(value)
                types[node.output[0]] = helper.make_tensor_type_proto(value.data_type, list(value.dims))
            new_nodes.append(node)
            continue
        if node.op_type in ("Shape", "Size") and node.domain in _DEFAULT_DOMAINS:
            dims = _known_dims(types.get(node.input[0]))
            if dims is not None and node.op_type == "Shape":
                start, end = _attr(node, "start", 0), _attr(node, "end", None)
                dims = dims[start:end]
                if None in dims:
                    partial[node.output[0]] = dims     # a symbolic dim: Gather/Slice of the static ones fold
                else:
                    values = [np.array(dims, dtype=np.int64)]
            elif dims is not None and None not in dims:
                values = [np.array(int(np.prod(dims)), dtype=np.int64)]
            if values is not None:
                summary.shape_ops += 1
        elif node.op_type in ("Gather", "Slice") and node.input[0] in partial \
                and all(i in consts for i in node.input[1:] if i):
            values = _pick_static(node, partial[node.input[0]], consts, opset)
        elif _foldable(node) and node.input and all(not i or i in consts for i in node.input):
            values = _evaluate(node, opset, consts)
        if values is not None:
            for name, value in zip(node.output, values):
                if name:
                    consts[name] = value
                    types[name] = _type_of(value, name)
                    new_nodes.append(_const_node(name, value, node))
            summary.folded[node.op_type] = summary.folded.get(node.op_type, 0) + 1
            continue
        new_nodes.append(node)
        _infer_outputs(node, types, consts, opset_imports)
    if summary.total:
        del graph.node[:]
        graph.node.extend(new_nodes)
        # types of folded values changed meaning (they are constants now); let the importer infer again
        kept = {n for node in new_nodes for n in node.output}
        keep_vi = [vi for vi in graph.value_info if vi.name in kept]
        del graph.value_info[:]
        graph.value_info.extend(keep_vi)
    return model, summary


def _evaluate(node, opset, consts) -> list | None:
    from onnx.reference import ReferenceEvaluator

    try:
        out = ReferenceEvaluator(node, opsets={"": opset}).run(None, {i: consts[i] for i in node.input if i})
    except Exception:  # noqa: BLE001 - an op the reference runtime cannot run stays in the graph
        return None
    out = list(out) if isinstance(out, (tuple, list)) else [out]
    arrays = []
    for value in out:
        if not isinstance(value, np.ndarray) or value.dtype == object or value.size > MAX_ELEMENTS:
            return None
        arrays.append(value)
    return arrays


def _infer_outputs(node, types, consts, opset_imports) -> None:
    """Refresh the node's output types from its inputs' (now possibly folded) types and values."""
    try:
        schema = onnx.defs.get_schema(node.op_type, max(o.version for o in opset_imports
                                                         if o.domain == node.domain or
                                                         (o.domain in _DEFAULT_DOMAINS and
                                                          node.domain in _DEFAULT_DOMAINS)), node.domain)
        inputs = {i: types[i] for i in node.input if i and i in types}
        if len(inputs) != len([i for i in node.input if i]):
            return
        data = {i: numpy_helper.from_array(consts[i], i) for i in node.input if i in consts}
        out = onnx.shape_inference.infer_node_outputs(schema, node, inputs, data, opset_imports=opset_imports)
    except Exception:  # noqa: BLE001 - no schema / inference error: keep the whole-graph types
        return
    for name, ty in out.items():
        if _known_count(ty) > _known_count(types.get(name)):
            types[name] = ty


def _known_count(ty) -> int:
    """How much of a type's shape is known: -1 without a rank, else the number of static dims."""
    dims = _known_dims(ty)
    return -1 if dims is None else sum(d is not None for d in dims)
