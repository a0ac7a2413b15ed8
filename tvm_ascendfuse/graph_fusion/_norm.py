"""Checks shared by the normalisation recognitions (reduction axes, affine parameter shapes)."""

from __future__ import annotations

import numpy as np

from ._graph import int_list


def keepdims_axes(call, ndim: int) -> list[int] | None:
    """Sorted non-negative reduction axes of a ``mean``/``sum``/``max`` with keepdims, else None."""
    if call is None or not bool(call.attrs.keepdims):
        return None
    axes = int_list(call.attrs.axis) if call.attrs.axis is not None else list(range(ndim))
    if axes is None:
        return None
    return sorted({a % ndim for a in axes})


def trailing(axes: list[int] | None, ndim: int) -> bool:
    return bool(axes) and axes == list(range(ndim - len(axes), ndim))


def affine_param(arr: np.ndarray | None, x_shape: tuple, axes: list[int], default: float) -> np.ndarray | None:
    """``arr`` (broadcast onto ``x_shape``) as a tensor of the normalised shape ``x_shape[axes]``.

    None if it varies along a non-normalised axis or would enlarge the result by broadcasting.
    """
    norm_shape = tuple(x_shape[a] for a in axes)
    if None in norm_shape:
        return None
    if arr is None:
        return np.full(norm_shape, default, dtype="float64")
    arr = np.asarray(arr, dtype="float64")
    if arr.ndim > len(x_shape):
        return None
    padded = (1,) * (len(x_shape) - arr.ndim) + tuple(arr.shape)
    for i, d in enumerate(padded):
        if d != 1 and (i not in axes or d != x_shape[i]):   # x_shape[i] is None for a symbolic axis
            return None
    full = np.broadcast_to(arr.reshape(padded), tuple(x_shape[i] if i in axes else 1 for i in range(len(x_shape))))
    return np.ascontiguousarray(full.reshape(norm_shape))
