"""Imports of torchvision and transformers that survive a torchvision wheel built for another torch.

The registry's torchvision 0.28 wheel is a CUDA build; against the CPU build of torch, importing it fails
while it registers fake (meta) kernels of its detection ops (``operator torchvision::nms does not exist``,
from ``torch.library.register_fake``). Those registrations only matter to ``torch.compile`` tracing of the
detection ops, which no classifier or language model uses, so a failing one is skipped. transformers
imports torchvision whenever it is installed, so it needs the same repair before its first import."""

from __future__ import annotations

import sys


def import_torchvision():
    """``torchvision``, with a fake-kernel registration that fails on this torch build skipped."""
    import torch

    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    original = torch.library.register_fake

    def tolerant(*args, **kwargs):
        try:
            decorator = original(*args, **kwargs)
        except RuntimeError:
            return lambda fn: fn

        def apply(fn):
            try:
                return decorator(fn)
            except RuntimeError:
                return fn
        return apply

    torch.library.register_fake = tolerant
    try:
        import torchvision
    finally:
        torch.library.register_fake = original
    return torchvision


def import_transformers():
    """``transformers``, after torchvision's import is repaired (when torchvision is installed at all)."""
    try:
        import_torchvision()
    except ImportError:
        pass                      # no torchvision: transformers does without it
    import transformers

    return transformers
