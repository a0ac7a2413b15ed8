"""UB fusion, part (a): group the chains the ``ascendfuse.*`` table names into Primitive functions.

Runs on high-level Relax ops (before LegalizeOps). Each pattern's checks read the target; a match a check
rejects, or whose family is switched off, is recorded in the report with the reason.
"""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import relax

from ..passbase import PyPass
from ..patterns import evaluate, pattern_table
from ..report import SWITCHED_OFF, FusionReport
from ..switches import FusionSwitches
from ..target import AscendTarget, current_target_from_tvm, get_target


def _composite_calls(mod) -> Counter:
    """Calls of each pattern's group function. FuseOpsByPattern shares one function between identical
    groups, so counting functions would undercount (three equal matmul+bias+relu layers = one function)."""
    names = {gv: str(f.attrs["Composite"]) for gv, f in mod.functions.items()
             if isinstance(f, relax.Function) and f.attrs and "Composite" in f.attrs}
    counts = Counter()

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.GlobalVar) and expr.op in names:
            counts[names[expr.op]] += 1

    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function) and gv not in names:
            relax.analysis.post_order_visit(f.body, visit)
    return counts


class PatternFusionPass(PyPass):
    """FuseOpsByPattern over the ascendfuse table, with checks bound to one target and one report."""

    def __init__(self, target: AscendTarget | str | None = None, report: FusionReport | None = None,
                 switches: FusionSwitches | None = None):
        self._target_spec = target
        self.report = report if report is not None else FusionReport()
        self.switches = switches if switches is not None else FusionSwitches()

    def pass_name(self) -> str:
        return "AscendPatternFusion"

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        target = (get_target(self._target_spec) if self._target_spec is not None
                  else current_target_from_tvm() or get_target("ascend910b"))
        specs = pattern_table()
        for s in specs:
            self.report.touch(s.switch)
        seen = set()

        def bind(spec):
            on = self.switches.is_on(spec.switch)

            def check(ctx) -> bool:
                reason, detail = (evaluate(spec, ctx, target) if on else (SWITCHED_OFF, {}))
                if reason is None:
                    return True
                root = ctx.value_to_bound_var.get(ctx.matched_expr)
                key = (spec.name, root)
                if key not in seen:
                    seen.add(key)
                    status = reason if reason in (SWITCHED_OFF, "ub_overflow") else "check_failed"
                    extra = {} if status == reason else {"failed": reason}
                    self.report.record(spec.switch, False, status, where=root.name if root is not None else None,
                                       pattern=spec.name, **extra, **detail)
                return False

            return check

        before = _composite_calls(mod)
        table = [(s.name, s.pattern, dict(s.annotations), bind(s)) for s in specs]
        mod = relax.transform.FuseOpsByPattern(table, bind_constants=False, annotate_codegen=False)(mod)
        made = _composite_calls(mod) - before
        by_name = {s.name: s for s in specs}
        for name, n in made.items():
            if name in by_name:
                for _ in range(n):
                    self.report.record(by_name[name].switch, True, pattern=name)
        return mod
