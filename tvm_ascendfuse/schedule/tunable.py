"""Tunable rules: a built-in rule as a MetaSchedule design space whose tile choice is a sampled decision.

The space of a kernel applies the same rule the schedule phase would (any rule declaring ``tunable``: GEMM,
conv, grouped/depthwise conv, attention, attention + projection, chained GEMM, GEMM+norm, multi-GEMM,
reduction, pool) to MetaSchedule's traced schedule, with its tiles drawn by ``sch.sample_categorical`` over
the rule's candidates (e.g. ``matmul.tile_candidates``: register block and K chunk;
``conv_schedule.conv_candidates``: register block and blocks of output rows; the row-blocked rules: rows per
block): tiles that fit the target's usable UB (and L1/L0) by the rule's own capacity checks, the rule's
default first. So every sampled schedule is UB-valid (a postproc re-checks the
counted bytes) and the untuned default is one point of the space.

Which rules are tunable comes from the rules themselves (``ScheduleRule.tunable`` and its contract in
``base.py``): a new rule joins ``ascendfuse tune`` by declaring it, without a change here or in ``tune/``.

The rule derives padding, weight packing and K chunks from the tiles in Python, so a trace alone does not
describe how to re-derive them under a new decision: search with ``ReplayFunc`` (the rule runs again for
every candidate), not with trace mutation. The recorded trace replays exactly: the decision, then the
primitives it led to. Draws favour the candidates drawn least so far, so a short run does not measure one
block twice before trying the others.

Every candidate's on-chip bytes are counted again on its scheduled TIR (``analysis/ub_usage.py``), once when
the space is enumerated and again by a MetaSchedule postprocessor on every measured candidate: a rule whose
own capacity check is wrong can cost a candidate, never a kernel that fails UB verification.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..errors import AscendFuseError
from ..target import AscendTarget, get_target
from .base import Declined, Scheduled
from .common import new_schedule

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
        if counts[0] is not None and counts[0] < 2:
            # the default goes first, twice: MetaSchedule draws one design space before the search that is
            # never measured, and the default must be measured (tune/search.py re-times it beside the finalists)
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


def tunable_rules() -> dict:
    """Rule name (as the report shows it) -> class, for every rule of the schedule phase that declares itself
    tunable (``ScheduleRule.tunable``)."""
    from .apply import DEFAULT_RULES

    return {rule.name: rule for rule in DEFAULT_RULES if getattr(rule, "tunable", False)}


def apply_tunable(sch: s_tir.Schedule, rule_name: str, target: AscendTarget, host, chooser) -> s_tir.Schedule:
    """Apply rule ``rule_name`` to ``sch`` in place with tiles from ``chooser``; raises when it declines."""
    rules = tunable_rules()
    if rule_name not in rules:
        raise AscendFuseError(f"rule '{rule_name}' has no tunable space; tunable rules: {', '.join(rules)}")
    out = rules[rule_name](tiles=chooser).schedule(sch, target, host)
    if isinstance(out, Scheduled):     # a rule with notes (``apply_with_note``) returns its schedule with one
        out = out.sch
    if not isinstance(out, s_tir.Schedule):
        why = f": {out.reason}" if isinstance(out, Declined) else ""
        raise AscendFuseError(f"rule '{rule_name}' declined the kernel under tiles "
                              f"{getattr(chooser, 'last', None)}{why}")
    return out


def ub_fits(func: tirx.PrimFunc, target: AscendTarget) -> bool:
    """Counted on-chip bytes of a scheduled kernel within the target's capacity for every scope."""
    from ..analysis.ub_usage import kernel_usage

    usage = kernel_usage("main", func, target)
    return all(usage.bytes(scope) <= target.capacity(scope) for scope in UB_CHECK_SCOPES)


def ub_check_postproc(target: AscendTarget):
    """A MetaSchedule postprocessor that rejects any candidate whose on-chip bytes, counted on its scheduled
    TIR, exceed the target's capacity in any scope (UB, L1, L0A/B/C): the check the pipeline's verification
    phase makes, so no record can hold a kernel that fails it. Works for any rule's space (it reads only the
    scheduled function); rejected candidates are redrawn by the search, never measured."""
    from tvm.s_tir import meta_schedule as ms

    @tvm.ir.utils.derived_object
    class UBCapacityCheck(ms.postproc.PyPostproc):
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

    return ms.space_generator.ScheduleFn(space, sch_rules=[], postprocs=[ub_check_postproc(npu)],
                                         mutator_probs={})


def candidate_schedules(workload: tvm.IRModule, rule_name: str, target: AscendTarget, host):
    """Every point of the space the rule accepts and whose counted on-chip bytes fit the target, as (tiles,
    schedule), the default first (the default is kept even over capacity: the untuned build uses it anyway,
    and the postprocessor keeps it from being measured)."""
    first = FixedTiles(0)
    out = [(first, apply_tunable(new_schedule(workload), rule_name, target, host, first))]  # must not decline
    for i in range(1, len(first.candidates)):
        chooser = FixedTiles(i)
        try:
            sch = apply_tunable(new_schedule(workload), rule_name, target, host, chooser)
        except AscendFuseError:
            continue
        if ub_fits(sch.mod["main"], target):
            out.append((chooser, sch))
    return [(chooser.candidates[chooser.index], sch) for chooser, sch in out]


def default_schedule(workload: tvm.IRModule, rule_name: str, target: AscendTarget, host) -> s_tir.Schedule:
    """The rule's own choice as a point of its space (decision 0), traced like every searched candidate."""
    return apply_tunable(new_schedule(workload), rule_name, target, host, FixedTiles(0))
