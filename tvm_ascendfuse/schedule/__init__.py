"""TensorIR schedule rules, one class per kind of fused kernel.

Bottom: ``base`` (the rule contract), ``common`` (sizing, loop and vectorise helpers), ``analysis`` (the
recognisers). Building blocks the rules share: ``contraction``, ``partial_sums``, ``injective``,
``conv_schedule``, ``layout``, ``transpose``, ``hostvec``, ``fast_math``. Rule files are peers and import
only those. ``apply`` (the schedule phase), ``prepack`` and ``tunable`` sit on top.
"""

from .base import L0A_SCOPE, L0B_SCOPE, L0C_SCOPE, L1_SCOPE, UB_SCOPE, ScheduleRule, Scheduled

__all__ = ["ScheduleRule", "Scheduled", "UB_SCOPE", "L1_SCOPE", "L0A_SCOPE", "L0B_SCOPE", "L0C_SCOPE"]
