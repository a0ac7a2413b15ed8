"""Verification phase: no scheduled kernel may need more on-chip buffer than the target has.

Runs after the schedule phase, before lowering. For every PrimFunc it counts the aligned bytes per
on-chip scope (``ub_usage.kernel_usages``: one buffer-compaction run over the module) and raises
``UBCapacityError(kernel, scope, needed, available)`` when one exceeds ``target.capacity(scope)``. It also
normalises alias scopes (``ub`` -> ``local.UB``) so hand-written kernels lower, and records each kernel's UB
bytes and occupancy in the report.
"""

from __future__ import annotations

from tvm import tirx

from ..errors import UBCapacityError
from ..passbase import PyPass
from ..report import FusionReport
from ..target import AscendTarget, get_target
from .ub_usage import ON_CHIP_SCOPES, kernel_usages, normalize_scope_aliases


class VerifyUBCapacity(PyPass):
    """Module pass: count on-chip bytes per kernel, fail on overflow, report UB occupancy."""

    def __init__(self, target: AscendTarget | str | None = None, report: FusionReport | None = None):
        self.target = target if isinstance(target, AscendTarget) else get_target(target)
        self.report = report

    def pass_name(self) -> str:
        return "AscendVerifyUBCapacity"

    def transform_module(self, mod):
        table = {}
        kernels = {}
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, tirx.PrimFunc):
                continue
            normalized = normalize_scope_aliases(func)
            if not normalized.same_as(func):
                mod[gv] = normalized
            kernels[gv.name_hint] = normalized
        usages = kernel_usages(kernels, self.target)     # one compaction run for the whole module
        for name, usage in usages.items():
            entry = {}
            for scope in ON_CHIP_SCOPES:
                needed = usage.bytes(scope)
                if not usage.allocations or (needed == 0 and not usage.symbolic(scope)):
                    continue
                available = self.target.capacity(scope)
                if needed > available:
                    raise UBCapacityError(name, scope, needed, available)
                entry[scope] = {"bytes": needed, "unpadded_bytes": usage.raw_bytes(scope),
                                "occupancy_pct": round(100.0 * needed / available, 1),
                                "padded_allocations": usage.unaligned(scope)}
                if usage.symbolic(scope):
                    entry[scope]["symbolic_allocations"] = usage.symbolic(scope)
            ub = usage.bytes("local.UB")
            table[name] = {"ub_bytes": ub,
                                   "ub_occupancy_pct": round(100.0 * ub / self.target.capacity("local.UB"), 1),
                                   "scopes": entry}
        if self.report is not None:
            self.report.sections.setdefault("ub_usage", {}).update(table)
            for row in self.report.kernels:
                if row.get("name") in table:
                    row["ub_bytes"] = table[row["name"]]["ub_bytes"]
                    row["ub_occupancy_pct"] = table[row["name"]]["ub_occupancy_pct"]
        return mod
