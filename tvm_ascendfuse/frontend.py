"""Model import with errors a user can act on."""

from __future__ import annotations

import os
import re
from pathlib import Path

import onnx

from .errors import ModelError, UnsupportedOpError


def load_onnx(model: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        proto = model
    else:
        path = Path(model)
        if not path.is_file():
            raise ModelError(f"model file '{path}' does not exist")
        try:
            proto = onnx.load(str(path))
        except Exception as err:  # protobuf raises several types for truncated or foreign files
            raise ModelError(f"'{path}' is not a readable ONNX model ({type(err).__name__}: {err})") from None
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


def import_onnx(model, shape_dict: dict | None = None):
    """ONNX -> Relax IRModule with weights as constants (so graph fusion can fold them)."""
    from tvm.relax.frontend.onnx import from_onnx

    proto = load_onnx(model)
    try:
        return from_onnx(proto, shape_dict=shape_dict)
    except Exception as err:
        msg = str(err).strip().splitlines()
        text = next((line for line in msg if "not supported" in line.lower() or "unsupported" in line.lower()),
                    msg[-1] if msg else type(err).__name__)
        if "not supported" in text.lower() or "unsupported" in text.lower() or isinstance(err, NotImplementedError):
            raise UnsupportedOpError(f"ONNX import failed: {text.strip()}") from None
        raise ModelError(f"ONNX import failed: {type(err).__name__}: {text.strip()}") from None
