"""Tunable rules: a built-in rule as a MetaSchedule design space whose tile choice is a sampled decision.

The space of a kernel applies the same rule the schedule phase would (``MatmulRule``, ``Conv2dRule``) to
MetaSchedule's traced schedule, with its tiles drawn by ``sch.sample_categorical`` over the rule's
candidates (``matmul.tile_candidates``: register block and K chunk; ``conv_schedule.conv_candidates``:
register block and blocks of output rows): tiles that fit the target's usable UB (and L1) by the rule's own
capacity checks, the rule's default first. So every sampled schedule is UB-valid (a postproc re-checks the
counted bytes) and the untuned default is one point of the space.

The rule derives padding, weight packing and K chunks from the tiles in Python, so a trace alone does not
describe how to re-derive them under a new decision: search with ``ReplayFunc`` (the rule runs again for
every candidate), not with trace mutation. The recorded trace replays exactly: the decision, then the
primitives it led to. Draws favour the candidates drawn least so far, so a short run does not measure one
block twice before trying the others.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..errors import AscendFuseError
from ..target import AscendTarget, get_target
from .conv import Conv2dRule
from .matmul import MatmulRule

UB_CHECK_SCOPES = ("local.UB", "local.L1", "local.L0A", "local.L0B", "local.L0C")


class LeastDrawnTiles:
    """The ``tiles`` chooser of a tunable rule (GemmTiles or ConvChoice candidates): one
    ``sample_categorical`` over the candidates, with probability only on the candidates drawn least often
    so far (the default first)."""

    def __init__(self):
        self.drawn: dict = {}
        self.allowed: set | None = None   # candidates the rule accepts (set by the space)
        self.last = None
        self.candidates: list = []

    def __call__(self, sch: s_tir.Schedule, default, candidates):
        cands = candidates()
        self.candidates = cands
        usable = [self.allowed is None or t in self.allowed for t in cands]
        counts = [self.drawn.get(t, 0) if ok else None for t, ok in zip(cands, usable)]
        low = min(c for c in counts if c is not None)
        if counts[0] < 2:
            # the default goes first, twice: MetaSchedule draws one design space before the search that is
            # never measured, and the default must be measured (tune.py re-times it beside the finalists)
            probs = [1.0 if i == 0 else 0.0 for i in range(len(cands))]
        else:
            n_low = counts.count(low)
            probs = [1.0 / n_low if c == low else 0.0 for c in counts]
        choice = sch.get(sch.sample_categorical(list(range(len(cands))), probs))
        tiles = cands[int(choice)]
        self.drawn[tiles] = self.drawn.get(tiles, 0) + 1
        self.last = tiles
        return tiles


class FixedTiles:
    """The ``tiles`` chooser that takes candidate ``index`` (still as a categorical decision): tests and
    the space's enumeration use it."""

    def __init__(self, index: int):
        self.index = index
        self.candidates: list = []

    def __call__(self, sch, default, candidates):
        cands = candidates()
        self.candidates = cands
        if not 0 <= self.index < len(cands):
            raise AscendFuseError(f"tile candidate {self.index} out of range: the kernel has {len(cands)}")
        probs = [1.0 if i == self.index else 0.0 for i in range(len(cands))]
        return cands[int(sch.get(sch.sample_categorical(list(range(len(cands))), probs)))]


# Rule name (as the report shows it) -> rule class that accepts a ``tiles`` chooser.
TUNABLE_RULES = {"matmul": MatmulRule, "conv2d": Conv2dRule}


def apply_tunable(sch: s_tir.Schedule, rule_name: str, target: AscendTarget, host, chooser) -> s_tir.Schedule:
    """Apply rule ``rule_name`` to ``sch`` in place with tiles from ``chooser``; raises when it declines."""
    if rule_name not in TUNABLE_RULES:
        raise AscendFuseError(f"rule '{rule_name}' has no tunable space; tunable rules: {', '.join(TUNABLE_RULES)}")
    out = TUNABLE_RULES[rule_name](tiles=chooser).schedule(sch, target, host)
    if out is None:
        raise AscendFuseError(f"rule '{rule_name}' declined the kernel under tiles {getattr(chooser, 'last', None)}")
    return out


def ub_fits(func: tirx.PrimFunc, target: AscendTarget) -> bool:
    """Counted on-chip bytes of a scheduled kernel within the target's capacity for every scope."""
    from ..analysis.ub_usage import kernel_usage

    usage = kernel_usage("main", func, target)
    return all(usage.bytes(scope) <= target.capacity(scope) for scope in UB_CHECK_SCOPES)


def _ub_check_postproc(target: AscendTarget):
    from tvm.s_tir import meta_schedule as ms

    @tvm.ir.utils.derived_object
    class UBCapacityCheck(ms.postproc.PyPostproc):
        """Rejects a candidate whose counted on-chip bytes exceed the target (none should: a safety net)."""

        def _initialize_with_tune_context(self, context) -> None:
            pass

        def apply(self, sch) -> bool:
            return ub_fits(sch.mod["main"], target)

        def clone(self):
            return UBCapacityCheck()

    return UBCapacityCheck()


def space_generator(rule_name: str, target: AscendTarget | str, host, chooser=None):
    """MetaSchedule ScheduleFn space of one kernel kind: the rule with a sampled tile decision."""
    from tvm.s_tir import meta_schedule as ms

    npu = target if isinstance(target, AscendTarget) else get_target(target)
    chooser = chooser if chooser is not None else LeastDrawnTiles()

    def space(sch: s_tir.Schedule) -> s_tir.Schedule:
        if getattr(chooser, "allowed", ()) is None:
            # once per kernel: only candidates the rule accepts may be drawn (a declined one leaves a
            # half-scheduled kernel behind)
            chooser.allowed = {t for t, _ in candidate_schedules(sch.mod, rule_name, npu, host)}
        return apply_tunable(sch, rule_name, npu, host, chooser)

    return ms.space_generator.ScheduleFn(space, sch_rules=[], postprocs=[_ub_check_postproc(npu)],
                                         mutator_probs={})


def candidate_schedules(workload: tvm.IRModule, rule_name: str, target: AscendTarget, host):
    """Every point of the space the rule accepts as (tiles, schedule), the default first."""
    first = FixedTiles(0)
    out = [(first, apply_tunable(s_tir.Schedule(workload), rule_name, target, host, first))]  # must not decline
    for i in range(1, len(first.candidates)):
        chooser = FixedTiles(i)
        try:
            out.append((chooser, apply_tunable(s_tir.Schedule(workload), rule_name, target, host, chooser)))
        except AscendFuseError:
            continue
    return [(chooser.candidates[chooser.index], sch) for chooser, sch in out]
