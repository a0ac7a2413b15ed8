"""The contract of a schedule rule (dlight style): ``apply`` returns a schedule or None.

Rules are tried in order; the first that returns a schedule wins. A rule sizes its tiles from the
AscendTarget (usable UB, double buffering, 32 B alignment), stages them in ``local.UB`` (cube operands may
use ``local.L1``/``local.L0A``/``local.L0B``/``local.L0C``), and vectorises/parallelises for the llvm host.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..target import AscendTarget

UB_SCOPE = "local.UB"
L1_SCOPE = "local.L1"
L0A_SCOPE = "local.L0A"
L0B_SCOPE = "local.L0B"
L0C_SCOPE = "local.L0C"


class ScheduleRule:
    """Subclass per kind of fused kernel. ``name`` is what the report shows for a kernel."""

    name = "rule"
    min_products = 0    # GEMM-like blocks a kernel needs before the rule is worth trying (apply.py checks)
    # A tunable rule (``ascendfuse tune`` searches it; ``tunable.py``) takes a ``tiles`` chooser in its
    # constructor, calls ``tiles(sch, default, candidates)`` once where it fixes its tiles (``default``: its own
    # choice; ``candidates()``: every choice that passes its capacity check, the default first, hashable and
    # printable) and uses what it returns, and schedules a given traced schedule in place with
    # ``schedule(sch, target, host)``.
    tunable = False

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> "s_tir.Schedule | None":
        raise NotImplementedError
