"""TensorIR schedule rules, one class per kind of fused kernel."""

from .base import L0A_SCOPE, L0B_SCOPE, L0C_SCOPE, L1_SCOPE, UB_SCOPE, ScheduleRule

__all__ = ["ScheduleRule", "UB_SCOPE", "L1_SCOPE", "L0A_SCOPE", "L0B_SCOPE", "L0C_SCOPE"]
