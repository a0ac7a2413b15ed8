"""Precision modes, with CANN's names (ATC ``--precision_mode``), and the plan one build follows.

On the host every kernel computes in float32 vectors (no 16-bit arithmetic unit: conversions at load and
store); a mode decides which dtype each tensor is *stored* in between kernels, i.e. what GM traffic and what
rounding the model sees, as on the NPU where each kernel reads and writes its GM tensors in that dtype and
accumulates in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import PrecisionModeError

SIXTEEN_BIT = ("float16", "bfloat16")

# mode -> (16-bit storage dtype or None, whether ops on the keep-list stay float32)
MODES = {
    "force_fp32": ("float32", False),         # float32 everywhere, also for a model stored in fp16
    "must_keep_origin_dtype": (None, False),  # the model's own dtypes (an fp16 model stays fp16)
    "allow_fp32_to_fp16": ("float16", True),  # as allow_mix_precision here: fp16 where the op is safe
    "force_fp16": ("float16", False),
    "allow_mix_precision": ("float16", True),
    "force_bf16": ("bfloat16", False),
    "allow_mix_precision_bf16": ("bfloat16", True),
}
DEFAULT_MODE = "must_keep_origin_dtype"

# Op-name fragments of what mixed precision keeps in float32 (CANN's keep-lists: softmax, norms, reductions,
# exp/log). A kernel's output has the dtype of the op that computes it: a kernel whose last op (layout ops
# skipped: they keep their input's dtype) is one of these stores its output in float32; a softmax inside an
# attention kernel never reaches GM. Shared by the host's storage (after scheduling) and the NPU traffic
# model (after grouping).
FP32_KEEP = frozenset({"softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm", "batch_norm",
                       "instance_norm", "mean", "sum", "variance", "std", "max", "min", "prod", "exp", "log",
                       "cumsum"})
LAYOUT_OPS = frozenset({"reshape", "permute_dims", "squeeze", "expand_dims", "flatten", "strided_slice", "split",
                        "concat", "broadcast_to", "layout_transform"})


def _bare(op) -> str:
    return str(op).split(".")[-1]


def keeps_fp32(ops) -> str | None:
    """The op (source op names of a kernel, in order) whose float32 output mixed precision keeps, or None."""
    for op in reversed(list(ops or ())):
        name = _bare(op)
        if name in LAYOUT_OPS:
            continue
        return str(op) if name in FP32_KEEP else None
    return None


@dataclass
class PrecisionPlan:
    """What one build stores in 16 bits. ``model_dtypes``: the 16-bit dtypes the model itself used
    (filled by ``Float32ComputePass``); ``mode``'s own dtype otherwise."""

    mode: str = DEFAULT_MODE
    model_dtypes: set = field(default_factory=set)
    keep_kernels: frozenset = frozenset()   # kernels whose outputs stay float32 (precision repair)

    @property
    def storage_dtype(self) -> str | None:
        converted, _ = MODES[self.mode]
        if converted is not None:
            return None if converted == "float32" else converted
        if len(self.model_dtypes) == 1:
            return next(iter(self.model_dtypes))
        return None   # a model mixing fp16 and bf16 tensors keeps float32 between kernels

    @property
    def keeps_fp32_ops(self) -> bool:
        return MODES[self.mode][1]


def resolve_mode(mode: str | None, target) -> str:
    """The mode's canonical name; a clear error for an unknown name or bf16 on a target without it."""
    if mode is None:
        return DEFAULT_MODE
    name = str(mode).strip().lower().replace("-", "_")
    if name not in MODES:
        raise PrecisionModeError(f"unknown precision mode '{mode}'; modes: {', '.join(MODES)}")
    if MODES[name][0] == "bfloat16" and not getattr(target, "bf16", False):
        raise PrecisionModeError(f"precision mode '{name}' needs bfloat16, which target '{target.name}' does not "
                                 "have; use force_fp16 or allow_mix_precision")
    return name


_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def short_dtypes(dtypes) -> list:
    """``float16`` -> ``f16`` and so on, for tables."""
    return [_SHORT.get(str(d), str(d)) for d in dtypes]
