"""Model import with errors a user can act on, and a model's data checked before any of it is read.

An ONNX file may keep tensors in external files (``data_location = EXTERNAL``, a ``location`` relative to the
model's folder). ``load_onnx`` parses the model without them, checks every reference (a relative path that
stays inside the model's folder after following symlinks, a regular file, offset and length within it) and
every tensor's declared size against the bytes the model or its file actually holds, and only then reads the
external data. A model that fails is refused with ``UnsafeModelError`` naming the tensor: a crafted
``location`` (``../../etc/passwd``, an absolute path, a symlink leading out) never gets opened, and a tensor
that declares terabytes is never allocated.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
import onnx
from onnx import TensorProto

from .errors import ModelError, UnsafeModelError, UnsupportedOpError

# Element widths of the packed sub-byte types (numpy's stand-ins for them take a whole byte).
_SUB_BYTE_BITS = {getattr(TensorProto, name): bits for name, bits in
                  (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2),
                   ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)) if hasattr(TensorProto, name)}
_COMPLEX = {TensorProto.COMPLEX64, TensorProto.COMPLEX128}


def _graph_tensors(graph):
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node):
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        if attr.HasField("sparse_tensor"):
            yield attr.sparse_tensor.values
            yield attr.sparse_tensor.indices
        if attr.HasField("g"):
            yield from _graph_tensors(attr.g)
        for sub in attr.graphs:
            yield from _graph_tensors(sub)


def model_tensors(proto: onnx.ModelProto):
    """Every TensorProto of a model: initializers, sparse initializers, tensor attributes (Constant), in
    subgraphs (If/Loop/Scan bodies) and in model-local functions."""
    yield from _graph_tensors(proto.graph)
    for func in proto.functions:
        for node in func.node:
            yield from _node_tensors(node)


def _declared_bytes(t: TensorProto) -> int | None:
    """Bytes the tensor's dims and type call for; None when not fixed (strings) or the type is unknown."""
    if any(d < 0 for d in t.dims):
        raise UnsafeModelError(f"tensor '{t.name}' has a negative dimension {list(t.dims)}")
    n = math.prod(t.dims)
    if t.data_type == TensorProto.STRING:
        return None
    bits = _SUB_BYTE_BITS.get(t.data_type)
    if bits is None:
        try:
            bits = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize * 8
        except Exception:  # an unknown data type: the checker names it
            return None
    return (n * bits + 7) // 8


def _stored_elements(t: TensorProto) -> int | None:
    """Elements the typed ``*_data`` field holds (a generous bound for packed types), None if not typed."""
    try:
        field = onnx.helper.tensor_dtype_to_field(t.data_type)
    except Exception:  # unknown data type
        return None
    count = len(getattr(t, field))
    if t.data_type in _COMPLEX:
        return count // 2
    bits = _SUB_BYTE_BITS.get(t.data_type)
    return count * (32 // bits) if bits else count


def _fmt_bytes(n: int) -> str:
    return f"{n} bytes" if n < 1 << 20 else f"{n} bytes ({n / (1 << 30):.3g} GiB)"


def _external_source(t: TensorProto, base: Path | None) -> tuple[Path, int, int]:
    """(file, offset, bytes available) of an external tensor, after checking the reference. Reads nothing."""
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    what = f"tensor '{t.name}' keeps its data in external file '{loc}'"
    if not loc:
        raise UnsafeModelError(f"tensor '{t.name}' is marked external but names no location")
    if base is None:
        raise UnsafeModelError(f"{what}, but the model was passed in memory: pass the model's path, so the file "
                               "is looked up in the model's folder")
    if "\x00" in loc:
        raise UnsafeModelError(f"{what}: the location contains a NUL byte")
    posix, win = PurePosixPath(loc.replace("\\", "/")), PureWindowsPath(loc)
    if posix.is_absolute() or win.is_absolute() or win.drive:
        raise UnsafeModelError(f"{what}: an absolute path; external data must be a relative path inside the "
                               f"model's folder '{base}' (refused, nothing read)")
    if ".." in posix.parts:
        raise UnsafeModelError(f"{what}: the path leads out of the model's folder '{base}' (refused, nothing read)")
    base_real = os.path.realpath(base)
    real = os.path.realpath(base / posix)
    if os.path.commonpath([real, base_real]) != base_real:
        raise UnsafeModelError(f"{what}: it resolves (through a symbolic link) to '{real}', outside the model's "
                               f"folder '{base}' (refused, nothing read)")
    if not os.path.isfile(real):
        raise ModelError(f"{what}, which does not exist in '{base}' or is not a regular file")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise UnsafeModelError(f"{what}: offset/length are not integers ({info.get('offset')!r}, "
                               f"{info.get('length')!r})") from None
    size = os.stat(real).st_size
    if offset < 0 or (length is not None and length < 0):
        raise UnsafeModelError(f"{what}: negative offset or length ({offset}, {length})")
    if offset > size or (length is not None and offset + length > size):
        raise UnsafeModelError(f"{what}: offset {offset} + length {length} reaches beyond the file's "
                               f"{_fmt_bytes(size)}")
    return Path(real), offset, (size - offset if length is None else length)


def check_tensor_data(proto: onnx.ModelProto, base: Path | None) -> list:
    """Refuse (``UnsafeModelError``) a model whose external data references leave ``base`` (the model's
    folder) or whose tensors declare more data than the model or the referenced file holds; nothing is read
    but the model itself. Returns ``(tensor, file, offset, bytes)`` for each external tensor, checked."""
    external = []
    for t in model_tensors(proto):
        declared = _declared_bytes(t)
        if t.data_location == TensorProto.EXTERNAL:
            path, offset, available = _external_source(t, base)
            if declared is not None and declared > available:
                raise UnsafeModelError(
                    f"tensor '{t.name}' declares {list(t.dims)} ({_fmt_bytes(declared)}) but its external file "
                    f"'{path.name}' holds {_fmt_bytes(available)} from offset {offset} (refused, not allocated)")
            external.append((t, path, offset, available if declared is None else declared))
            continue
        if declared is None or declared == 0:
            continue
        if t.raw_data:
            if len(t.raw_data) != declared:
                raise UnsafeModelError(f"tensor '{t.name}' declares {list(t.dims)} ({_fmt_bytes(declared)}) but "
                                       f"holds {_fmt_bytes(len(t.raw_data))} of data (refused, not allocated)")
            continue
        stored = _stored_elements(t)
        if stored is not None and stored < math.prod(t.dims):
            raise UnsafeModelError(f"tensor '{t.name}' declares {list(t.dims)} ({math.prod(t.dims)} elements) but "
                                   f"holds {stored} (refused, not allocated)")
    return external


def _read_external(t: TensorProto, file: Path, offset: int, nbytes: int) -> None:
    """Read a checked external tensor's bytes (from the resolved file, exactly the declared amount) into it.
    onnx's own loader would refuse any symlink, even one inside the model's folder; this one follows links
    that ``_external_source`` resolved to the folder."""
    try:
        with open(file, "rb") as f:
            f.seek(offset)
            data = f.read(nbytes)
    except OSError as err:
        raise ModelError(f"cannot read external data of tensor '{t.name}' from '{file.name}': {err}") from None
    if len(data) != nbytes:
        raise ModelError(f"external file '{file.name}' of tensor '{t.name}' ended after {len(data)} of "
                         f"{nbytes} bytes")
    t.raw_data = data
    t.data_location = TensorProto.DEFAULT
    del t.external_data[:]


def load_onnx(model: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        proto = model
        check_tensor_data(proto, None)
    else:
        path = Path(model)
        if not path.is_file():
            raise ModelError(f"model file '{path}' does not exist")
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as err:  # protobuf raises several types for truncated or foreign files
            raise ModelError(f"'{path}' is not a readable ONNX model ({type(err).__name__}: {err})") from None
        for tensor, file, offset, nbytes in check_tensor_data(proto, path.absolute().parent):
            _read_external(tensor, file, offset, nbytes)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else "invalid model"
        unknown = re.search(r"No Op registered for (\S+) with domain_version of (\d+)", first)
        if unknown:
            # An op type the ONNX schema does not know: say so by name, as for ops TVM cannot import.
            raise UnsupportedOpError(f"ONNX model uses operator '{unknown.group(1)}', which is not an ONNX "
                                     f"operator at opset {unknown.group(2)}") from None
        raise ModelError(f"ONNX model is malformed: {first}") from None
    if not proto.graph.node:
        raise ModelError("ONNX model has an empty graph")
    return proto


FRONTEND_ATTR = "ascendfuse.frontend"


def import_onnx(model, shape_dict: dict | None = None, fold_shapes: bool = True):
    """ONNX -> Relax IRModule with weights as constants (so graph fusion can fold them).

    ``fold_shapes`` (on by default): shape computations on static tensors are folded to constants on the
    ONNX graph first (``onnx_shapes.fold_shapes``); without it TVM's importer cannot take models such as
    torchvision's Swin-T ("Reshape expects the input tensor to have known shape"). Computations on a
    symbolic dimension (an LLM decode step's cache length) are evaluated symbolically during the import
    (``onnx_symbolic``), so the dimension stays one ``tirx.Var`` in ``main``'s signature and in every shape
    derived from it. What was folded is kept as the module attribute ``ascendfuse.frontend`` and lands in
    the report's ``frontend`` section. ``fold_shapes=False`` imports exactly as TVM does."""
    from tvm.relax.frontend.onnx import from_onnx

    proto = load_onnx(model)
    folding = None
    if fold_shapes:
        from .onnx_shapes import fold_shapes as fold
        # sizes computed from a symbolic dimension are evaluated symbolically (onnx_symbolic's docstring)
        from .onnx_symbolic import from_onnx

        proto, folding = fold(proto)
    proto = _axes_as_lists(proto)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):   # TVM prints "Error converting operator X" on a failure
            mod = from_onnx(proto, shape_dict=shape_dict)
    except Exception as err:
        failed_op = re.search(r"Error converting operator (\S+?),", printed.getvalue())
        msg = str(err).strip().splitlines()
        if failed_op and not isinstance(err, NotImplementedError):
            # the importer took the op but cannot convert this use of it: TVM's limitation, named
            why = _check_text(msg[-1] if msg else type(err).__name__)
            raise UnsupportedOpError(f"TVM {_tvm_version()} cannot import ONNX operator '{failed_op.group(1)}': "
                                     f"{why}") from None
        text = next((line for line in msg if "not supported" in line.lower() or "unsupported" in line.lower()),
                    msg[-1] if msg else type(err).__name__)
        if "not supported" in text.lower() or "unsupported" in text.lower() or isinstance(err, NotImplementedError):
            raise UnsupportedOpError(f"ONNX import failed: {text.strip()}") from None
        raise ModelError(f"ONNX import failed: {type(err).__name__}: {text.strip()}") from None
    info = {"shape_folding": folding.as_dict() if folding is not None else "off"}
    return mod.with_attr(FRONTEND_ATTR, info)


def _axes_as_lists(proto):
    """Unsqueeze/Squeeze whose ``axes`` is a 0-d constant (the dynamo export's repeat of key/value heads for
    ``enable_gqa``; ONNX Runtime takes it) get a 1-element list, the form TVM's importer iterates over."""
    from onnx import numpy_helper

    inits = {t.name: t for t in proto.graph.initializer}
    scalar = {n.input[1] for n in proto.graph.node if n.op_type in ("Unsqueeze", "Squeeze") and len(n.input) > 1
              and n.input[1] in inits and len(inits[n.input[1]].dims) == 0}
    if not scalar:
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for name in sorted(scalar):     # a new 1-element tensor: other readers of the scalar keep it
        out.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(inits[name]).reshape(1),
                                                             name + "__axes"))
    for n in out.graph.node:
        if n.op_type in ("Unsqueeze", "Squeeze") and len(n.input) > 1 and n.input[1] in scalar:
            n.input[1] += "__axes"
    return out


def _check_text(line: str) -> str:
    """TVM's error line without its "Check failed: (cond) is false:" prefix."""
    return re.sub(r"^.*?Check failed: \(.*?\) is false:\s*", "", line.strip())


def _tvm_version() -> str:
    import tvm

    return tvm.__version__
