"""The contract of a schedule rule (dlight style): ``apply`` returns a schedule or None.

Rules are tried in order; the first that returns a schedule wins. A rule declines only by returning None;
an exception escaping a rule is a bug, which the schedule phase records in the report (``rule_errors``)
before it tries the next rule. A rule sizes its tiles from the AscendTarget (usable UB, double buffering,
32 B alignment), stages them in ``local.UB`` (cube operands may use ``local.L1``/``local.L0A``/``local.L0B``/
``local.L0C``), and vectorises/parallelises for the llvm host.

What a rule has to say about a schedule it made (the row block it chose, rows it could not stage) travels
with the schedule: such a rule implements ``apply_with_note`` instead of ``apply``, and may also return
``Declined(reason)`` there when the report should say why it said no (e.g. a tuned record for another CPU).
Rules keep no state between calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx

from ..target import AscendTarget

UB_SCOPE = "local.UB"
L1_SCOPE = "local.L1"
L0A_SCOPE = "local.L0A"
L0B_SCOPE = "local.L0B"
L0C_SCOPE = "local.L0C"


@dataclass(frozen=True)
class Scheduled:
    """A rule's schedule and the note the report shows for the kernel (None: nothing to say)."""

    sch: s_tir.Schedule
    note: str | None = None


@dataclass(frozen=True)
class Declined:
    """A decline the report should explain (``schedule_notes``); ``apply`` turns it into None."""

    reason: str


class ScheduleRule:
    """Subclass per kind of fused kernel; implement ``apply`` or ``apply_with_note``. ``name`` is what the
    report shows for a kernel."""

    name = "rule"
    min_products = 0    # GEMM-like blocks a kernel needs before the rule is worth trying (apply.py checks)
    # A tunable rule (``ascendfuse tune`` searches it; ``tunable.py``) takes a ``tiles`` chooser in its
    # constructor, calls ``tiles(sch, default, candidates)`` once where it fixes its tiles (``default``: its own
    # choice; ``candidates()``: every choice that passes its capacity check, the default first, hashable and
    # printable) and uses what it returns, and schedules a given traced schedule in place with
    # ``schedule(sch, target, host)``.
    tunable = False
    tiles = None        # the ``tiles`` chooser of a tunable rule (None: the rule's own choice)
    # ``prepare(func) -> func``: a rewrite a tunable rule makes of a kernel before scheduling it, which no trace
    # records (e.g. index simplification); the tuner searches, and records are keyed by, the prepared kernel
    prepare = None

    def __init__(self, tiles=None):
        self.tiles = tiles

    def choose(self, sch, default, candidates):
        """The rule's tile decision: ``default`` without a chooser, else the chooser's pick from
        ``candidates()`` (a sampled decision of ``sch``'s trace; see ``tunable``)."""
        return default if self.tiles is None else self.tiles(sch, default, candidates)

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> "s_tir.Schedule | None":
        """A schedule of ``func``, or None to decline."""
        result = self.apply_with_note(func, target, host)
        return result.sch if isinstance(result, Scheduled) else None

    def apply_with_note(self, func: tirx.PrimFunc, target: AscendTarget, host) -> "Scheduled | Declined | None":
        """``apply``, with the note the report shows for the kernel (or the reason it declined)."""
        if type(self).apply is ScheduleRule.apply:
            raise NotImplementedError(f"{type(self).__name__} implements neither apply nor apply_with_note")
        sch = self.apply(func, target, host)
        return None if sch is None else Scheduled(sch)
