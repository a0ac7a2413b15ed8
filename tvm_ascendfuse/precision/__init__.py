"""Precision modes (CANN's names): 16-bit storage between kernels, float32 compute inside them.

``Float32ComputePass`` (before graph fusion) computes a 16-bit model in float32; ``SixteenBitStoragePass``
(after scheduling) makes the kernels load and store their GM tensors in the plan's 16-bit dtype.
"""

from .compute_fp32 import Float32ComputePass
from .modes import DEFAULT_MODE, MODES, PrecisionModeError, PrecisionPlan, resolve_mode

__all__ = ["DEFAULT_MODE", "MODES", "Float32ComputePass", "PrecisionModeError", "PrecisionPlan", "resolve_mode"]
