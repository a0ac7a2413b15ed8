"""PyTorch in: ``torch.export`` -> Relax with the weights bound as constants, ready for ``compile_model``.

    mod = from_torch(model, (x,))                     # an nn.Module and example inputs
    mod = import_exported_program("model.pt2")        # a file written by torch.export.save

torch is an optional extra (``pip install .[torch]``); nothing else in the package imports this module.

The exported program is translated *without* running torch's core-ATen decompositions first
(``run_ep_decomposition=False``): then LayerNorm, GELU, Linear (``permute_dims`` + ``matmul``) and
``scaled_dot_product_attention`` arrive as one Relax op each, the forms the graph-fusion passes work on
(decomposed, SDPA becomes a dozen reshapes, broadcasts and a NaN guard). A program holding an op the
translator only knows in decomposed form is retried with the decompositions.

Four of TVM's converters for un-decomposed programs are replaced (``_CONVERTERS``): ``aten.cat`` (torch
skips 1-D empty operands, TVM rejects the rank mismatch), ``aten.slice`` (a symbolic end torch proved in
bounds is not clamped, so the slice keeps the length it is sliced to), ``aten.batch_norm``
(TVM reads its arguments in the order of ``_native_batch_norm_legit``, so inference BatchNorm came out in
training mode with the momentum as epsilon) and ``scaled_dot_product_attention`` (TVM drops its ``scale``
argument; ours also takes boolean masks, as the additive 0 / -inf mask, and ``enable_gqa``, as the key/value
heads repeated by expand/reshape). The recurrent layers ``aten.lstm``, ``aten.gru`` and ``aten.rnn_tanh``
(which TVM unrolls step by step, one layer only) are one layer kernel per layer (``torch_recurrent``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .errors import ModelError, UnsupportedOpError
from .torch_recurrent import CONVERTERS as _RECURRENT


def _torch():
    try:
        import torch
    except ImportError:
        raise ModelError("PyTorch is not installed; install the extra: pip install 'tvm_ascendfuse[torch]'") from None
    return torch


def _arg(node, index: int, name: str, default):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _batch_norm(node, importer):
    """``aten.batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, cudnn)``."""
    import numpy as np
    from tvm import relax

    x = importer.env[node.args[0]]
    channels = int(importer.shape_of(x)[1])
    dtype = x.ty.dtype.dtype if hasattr(x.ty.dtype, "dtype") else str(x.ty.dtype)

    def param(i, fill):
        ref = node.args[i] if len(node.args) > i else None
        return importer.env[ref] if ref is not None else relax.const(np.full(channels, fill), dtype=dtype)

    if _arg(node, 5, "training", False):
        raise ModelError(f"BatchNorm '{node.name}' was exported in training mode (batch statistics); export the "
                         "module after module.eval() (from_torch does this)")
    out = importer.block_builder.emit(relax.op.nn.batch_norm(
        x, param(1, 1.0), param(2, 0.0), param(3, 0.0), param(4, 1.0), axis=1,
        epsilon=float(_arg(node, 7, "eps", 1e-5)), center=True, scale=True,
        momentum=float(_arg(node, 6, "momentum", 0.1)), training=False))
    return importer.block_builder.emit(out[0])


def _repeat_heads(bb, t, heads: int, name: str):
    """``enable_gqa``: the (batch, kv_heads, seq, dim) key/value repeated to ``heads`` heads as models write
    it (expand_dims -> broadcast_to -> reshape), the form the attention kernel takes without materialising
    the repeat."""
    from tvm import relax

    dims = [getattr(x, "value", None) for x in t.ty.shape]
    if None in dims:
        raise UnsupportedOpError(f"scaled_dot_product_attention '{name}': enable_gqa with symbolic shapes")
    b, kv, n, d = dims
    if heads % kv:
        raise UnsupportedOpError(f"scaled_dot_product_attention '{name}': {heads} query heads are not a "
                                 f"multiple of {kv} key/value heads")
    if heads == kv:
        return t
    wide = bb.emit(relax.op.broadcast_to(bb.emit(relax.op.expand_dims(t, [2])), (b, kv, heads // kv, n, d)))
    return bb.emit(relax.op.reshape(wide, (b, heads, n, d)))


def _sdpa(node, importer):
    """``scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)`` on
    (batch, heads, seq, head_dim) tensors -> ``R.nn.attention`` (which takes batch, seq, heads, head_dim)."""
    from tvm import relax

    q, k, v = (importer.env[a] for a in node.args[:3])
    mask = _arg(node, 3, "attn_mask", None)
    if float(_arg(node, 4, "dropout_p", 0.0)) != 0.0:
        raise UnsupportedOpError(f"scaled_dot_product_attention '{node.name}' has dropout; export in eval mode")
    if len(q.ty.shape) != 4:
        raise UnsupportedOpError(f"scaled_dot_product_attention '{node.name}' on {len(q.ty.shape)}-D inputs; "
                                 "only (batch, heads, seq, head_dim) is supported")
    bias = None
    if mask is not None:
        bias = importer.env[mask]
    bb = importer.block_builder
    dtype = str(q.ty.dtype)
    if mask is not None and str(bias.ty.dtype) == "bool":
        # a boolean mask keeps the keys where it is True: the additive mask 0 / -inf (torch's definition)
        bias = bb.emit(relax.op.where(bias, relax.const(0.0, dtype), relax.const(float("-inf"), dtype)))
    elif mask is not None and "float" not in str(bias.ty.dtype):
        raise UnsupportedOpError(f"scaled_dot_product_attention '{node.name}' has a {bias.ty.dtype} mask; "
                                 "only boolean and additive float masks are supported")
    if bias is not None and len(bias.ty.shape) < 4:
        # R.nn.attention takes a 4-D bias; torch broadcasts a (seq_q, seq_kv) mask over batch and heads
        shape = [1] * (4 - len(bias.ty.shape)) + list(bias.ty.shape)
        bias = bb.emit(relax.op.reshape(bias, shape))
    if _arg(node, 7, "enable_gqa", False):
        k, v = (_repeat_heads(bb, t, int(q.ty.shape[1]), node.name) for t in (k, v))
    scale = _arg(node, 6, "scale", None)
    to_bsnh = lambda t: bb.emit(relax.op.permute_dims(t, [0, 2, 1, 3]))
    out = bb.emit(relax.op.nn.attention(to_bsnh(q), to_bsnh(k), to_bsnh(v), bias=bias,
                                        scale=float(scale) if scale is not None else None,
                                        causal_mask="TopLeft" if _arg(node, 5, "is_causal", False) else None))
    return to_bsnh(out)


def _is_legacy_empty(t) -> bool:
    """A 1-D tensor of static length 0."""
    shape = getattr(t.ty, "shape", None)
    dims = getattr(shape, "values", None)
    return dims is not None and len(dims) == 1 and getattr(dims[0], "value", None) == 0


def _cat(node, importer):
    """``aten.cat(tensors, dim)``. torch skips 1-D empty operands whatever the others' rank (a legacy rule a
    lazily started KV cache relies on: transformers' ``DynamicCache`` concatenates its empty initial keys
    with the first step's (batch, heads, seq, dim) keys); Relax's concat requires one rank, so they are
    dropped here."""
    from tvm import relax

    parts = [importer.env[a] for a in node.args[0]]
    kept = [t for t in parts if not _is_legacy_empty(t)] or parts[:1]
    axis = _arg(node, 1, "dim", 0)
    if len(kept) == 1:
        return kept[0]
    return importer.block_builder.emit(relax.op.concat(kept, axis=axis))


def _slice(node, importer):
    """``aten.slice(x, dim, start, end, step)`` with a symbolic end torch proved in bounds: the slice of
    Hugging Face's position-id buffer (64 positions) to the sequence length ``s``, which torch.export bounds
    by 64. TVM's converter clamps the end (its output length ``min(s, 64)``), and ``min(s, 64)`` then does
    not match the embeddings' length ``s``: their sum, and everything after it, lost its shape. torch's
    own output length for the slice (``node.meta['val']``) says whether the clamp can bind; when it has no
    min/max the slice is emitted as in bounds."""
    from tvm import relax

    end = _arg(node, 3, "end", None)
    val = node.meta.get("val")
    dim = _arg(node, 1, "dim", 0)
    step = _arg(node, 4, "step", 1)
    start = _arg(node, 2, "start", None)
    size = val.shape[dim] if val is not None and hasattr(val, "shape") else None
    expr = getattr(getattr(size, "node", None), "expr", None)
    if (end is None or not hasattr(end, "op") or not isinstance(step, int) or not isinstance(start or 0, int)
            or expr is None or "Min" in str(expr) or "Max" in str(expr)):
        return importer._slice(node)
    x = importer.env[node.args[0]]
    return importer.block_builder.emit(relax.op.strided_slice(
        x, [dim], [start or 0], [importer.env[end]], [step], assume_inbound=True))


_CONVERTERS = {
    "batch_norm.default": _batch_norm,
    "cat.default": _cat,
    "slice.Tensor": _slice,
    "scaled_dot_product_attention.default": _sdpa,
    **_RECURRENT,
}


def import_exported_program(program, decompose: bool | None = None):
    """An ``ExportedProgram`` (or the path of a ``torch.export.save`` file) -> Relax IRModule with the
    weights as constants. ``decompose=None`` tries without torch's decompositions first (see the module
    docstring); True/False forces one."""
    torch = _torch()
    if isinstance(program, (str, os.PathLike)):
        program = load_exported_program(program)
    if not isinstance(program, torch.export.ExportedProgram):
        raise ModelError(f"expected a torch.export.ExportedProgram, got {type(program).__name__}")
    from tvm.relax.frontend.torch import from_exported_program

    tries = [False, True] if decompose is None else [bool(decompose)]
    for i, dec in enumerate(tries):
        try:
            return from_exported_program(program, run_ep_decomposition=dec, custom_convert_map=_CONVERTERS,
                                         unwrap_unit_return_tuple=True)
        except (ModelError, UnsupportedOpError):
            raise
        except Exception as err:  # noqa: BLE001 - the translator raises AssertionError/ValueError/KeyError...
            if i + 1 < len(tries):
                continue
            text = (str(err).strip().splitlines() or [type(err).__name__])[-1].strip()
            if "unsupported" in text.lower() or "not supported" in text.lower():
                raise UnsupportedOpError(f"PyTorch import failed: {text}") from None
            raise ModelError(f"PyTorch import failed: {type(err).__name__}: {text}") from None
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _weights_only_unpickling():
    """Every ``torch.load`` inside runs with torch's restricted (weights-only) unpickler.

    A ``.pt2`` keeps its weights and constants as torch pickles, and ``torch.export.load`` retries a payload
    its weights-only loader refuses with the full unpickler, which runs whatever code the file names. A model
    file is input from anywhere: torch's ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` switch turns that retry into a
    second refusal, so a foreign object in the file is an error, never code run."""
    key = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def load_exported_program(path: str | os.PathLike):
    """Read a file written by ``torch.export.save`` (``.pt2``), with errors a user can act on."""
    torch = _torch()
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model file '{path}' does not exist")
    try:
        with _weights_only_unpickling():
            return torch.export.load(str(path))
    except Exception as err:  # noqa: BLE001 - zipfile, pickle and torch errors for foreign or truncated files
        first = (str(err).strip().splitlines() or [""])[0]
        raise ModelError(f"'{path}' is not a readable torch.export program ({type(err).__name__}: {first})") \
            from None


def from_torch(module, example_args, dynamic_shapes=None, example_kwargs=None):
    """``torch.export.export`` + Relax import: ``module`` with ``example_args`` (a tensor or a tuple of them)
    -> IRModule for ``compile_model``. The module is exported in eval mode (dropout off, BatchNorm on its
    running statistics) and put back in the mode it was in."""
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"from_torch expects a torch.nn.Module, got {type(module).__name__}")
    if isinstance(example_args, torch.Tensor):
        example_args = (example_args,)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            program = torch.export.export(module, tuple(example_args), kwargs=example_kwargs,
                                          dynamic_shapes=dynamic_shapes)
    except Exception as err:  # noqa: BLE001 - torch.export raises many types (UserError, Unsupported, ...)
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ModelError(f"torch.export failed: {type(err).__name__}: {first}") from None
    finally:
        module.train(was_training)
    return import_exported_program(program)
