"""The ``ascendfuse.*`` pattern table: patterns declared as data, each with checks that read the target.

A family module (conv.py, matmul.py, ...) calls ``declare(...)`` for each pattern. ``register_all()``
publishes the table in TVM's pattern registry (as tuples, see the TVM 0.27 field guide) so users can call
``get_patterns_with_prefix("ascendfuse")``; the UB-fusion pass builds its own copies whose checks also
record into a report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from tvm.relax.dpl import DFPattern
from tvm.relax.transform import PatternCheckContext

from ..errors import AscendFuseError, PatternCheckError
from ..target import AscendTarget, current_target_from_tvm, get_target

PREFIX = "ascendfuse"

# A check returns None when the match may fuse, else a short reason naming what failed.
Check = Callable[[PatternCheckContext, AscendTarget], "str | None"]
# A working-set function returns the bytes of UB the smallest legal tile of the fused group needs.
WorkingSet = Callable[[PatternCheckContext, AscendTarget], int]


@dataclass(frozen=True)
class PatternSpec:
    name: str                      # full name, "ascendfuse.<family>.<variant>"
    switch: str                    # the UBFusion switch that turns the family on/off
    pattern: DFPattern
    annotations: Mapping[str, DFPattern] = field(default_factory=dict)
    checks: tuple[Check, ...] = ()
    working_set: WorkingSet | None = None
    priority: int = 0              # higher is tried first (longer chains get higher priority)
    description: str = ""


_TABLE: dict[str, PatternSpec] = {}


def declare(spec: PatternSpec) -> PatternSpec:
    if not spec.name.startswith(PREFIX + "."):
        raise ValueError(f"pattern name must start with '{PREFIX}.': {spec.name}")
    _TABLE[spec.name] = spec
    return spec


def pattern_table() -> list[PatternSpec]:
    """All declared patterns, highest priority first (ties: declaration order reversed = later wins)."""
    from . import load_families

    load_families()
    specs = list(_TABLE.values())
    order = {s.name: i for i, s in enumerate(specs)}
    return sorted(specs, key=lambda s: (-s.priority, -order[s.name]))


def _call(spec: PatternSpec, fn, ctx, target):
    """A check that raises is a bug in that pattern: fail the build naming it, rather than silently fuse
    (a wrong answer) or silently skip (the user's pattern never applies and nothing says why)."""
    try:
        return fn(ctx, target)
    except AscendFuseError:
        raise
    except Exception as err:
        what = getattr(fn, "__name__", "check")
        raise PatternCheckError(f"pattern '{spec.name}': {what} raised {type(err).__name__}: {err}") from None


def evaluate(spec: PatternSpec, ctx: PatternCheckContext, target: AscendTarget) -> tuple[str | None, dict]:
    """Run a pattern's checks; returns (reason or None, detail for the report)."""
    for check in spec.checks:
        reason = _call(spec, check, ctx, target)
        if reason:
            return reason, {"check": getattr(check, "__name__", "check")}
    if spec.working_set is not None:
        need = int(_call(spec, spec.working_set, ctx, target))
        if need > target.ub_usable:
            return "ub_overflow", {"bytes_needed": need, "bytes_available": target.ub_usable}
    return None, {}


def _global_check(spec: PatternSpec):
    def check(ctx: PatternCheckContext) -> bool:
        target = current_target_from_tvm() or get_target("ascend910b")
        return evaluate(spec, ctx, target)[0] is None

    return check


_REGISTERED = False


def register_all() -> None:
    """Publish the table to ``tvm.relax.backend.pattern_registry`` (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from tvm.relax.backend.pattern_registry import register_patterns

    # The registry returns the LAST registered first, so register lowest priority first.
    register_patterns([(s.name, s.pattern, dict(s.annotations), _global_check(s))
                       for s in reversed(pattern_table())])
    _REGISTERED = True
