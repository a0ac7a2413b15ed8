"""Precision modes (CANN's names): 16-bit storage between kernels, float32 compute inside them.

``Float32ComputePass`` (before graph fusion) computes a 16-bit model in float32, after
``ClampCallsAsOpsPass`` turned the importer's clamp PrimFuncs into ops it can widen; ``SixteenBitStoragePass``
(after scheduling) makes the kernels load and store their GM tensors in the plan's 16-bit dtype;
``RoundWeightsPass`` (after graph fusion) gives a float32 model converted by a mode its 16-bit weight values;
``on_chip.MarkOnChipDtype`` (after FuseTIR) marks the kernels whose tiles the NPU holds in 16 bits, for the
capacity checks of the grouping, the schedule rules and the verification.
"""

from .clamp_calls import ClampCallsAsOpsPass
from .compute_fp32 import Float32ComputePass
from .round_weights import RoundWeightsPass
from .storage import SixteenBitStoragePass
from .modes import DEFAULT_MODE, MODES, PrecisionModeError, PrecisionPlan, resolve_mode

__all__ = ["ClampCallsAsOpsPass", "DEFAULT_MODE", "MODES", "Float32ComputePass", "PrecisionModeError", "PrecisionPlan", "resolve_mode", "RoundWeightsPass", "SixteenBitStoragePass"]
