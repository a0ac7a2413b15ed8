"""The fusion report (``fusion_result.json``): CANN's match/effect counts plus why a match did not fuse.

Passes record into one ``FusionReport``; the pipeline adds the kernel list and writes it out.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from typing import Any

from .switches import GRAPH_FUSION, UB_FUSION, known_switches

# Reason codes for a match that did not take effect.
SWITCHED_OFF = "switched_off"
CHECK_FAILED = "check_failed"
UB_OVERFLOW = "ub_overflow"
NOT_PROFITABLE = "not_profitable"
CAP_HIT = "cap_hit"
CYCLE = "cycle"
TAKEN_BY_OTHER = "taken_by_other_pattern"
NO_SCHEDULE = "no_schedule"            # only the fallback rule would schedule the merged kernel
SLOWER_SCHEDULE = "slower_schedule"    # the merged kernel would get a worse rule than each of its parts


@dataclass
class PassRecord:
    match_times: int = 0
    effect_times: int = 0
    not_effective: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"match_times": self.match_times, "effect_times": self.effect_times,
                "not_effective": list(self.not_effective)}


class FusionReport:
    """Counts per pass, refusals with reasons, and the kernels of the compiled module."""

    def __init__(self, target_name: str | None = None):
        self.target_name = target_name
        self.passes: dict[str, PassRecord] = {}
        self.kernels: list[dict[str, Any]] = []
        self.sections: dict[str, Any] = {}

    def record(self, pass_name: str, effect: bool, reason: str | None = None, where: str | None = None,
               **detail: Any) -> None:
        """One match of ``pass_name``: it fused (``effect``) or did not, for ``reason``."""
        rec = self.passes.setdefault(pass_name, PassRecord())
        rec.match_times += 1
        if effect:
            rec.effect_times += 1
        else:
            entry = {"reason": reason or CHECK_FAILED}
            if where:
                entry["where"] = where
            entry.update(detail)
            rec.not_effective.append(entry)

    def touch(self, pass_name: str) -> None:
        """Make a pass that ran but matched nothing show up with zero counts."""
        self.passes.setdefault(pass_name, PassRecord())

    def get(self, pass_name: str) -> PassRecord:
        return self.passes.get(pass_name, PassRecord())

    def checkpoint(self) -> tuple:
        """A copy of everything recorded so far (``restore`` returns to it)."""
        return copy.deepcopy((self.passes, self.kernels, self.sections))

    def restore(self, state: tuple) -> None:
        """Forget what was recorded after ``state`` was taken (the phases that ran since run again)."""
        self.passes, self.kernels, self.sections = copy.deepcopy(state)

    def set_kernels(self, kernels: list[dict[str, Any]]) -> None:
        self.kernels = list(kernels)

    def to_dict(self) -> dict[str, Any]:
        switches = known_switches()
        by_cat: dict[str, dict[str, Any]] = {"graph_fusion": {}, "ub_fusion": {}, "other": {}}
        for name in sorted(self.passes):
            cat = switches[name].category if name in switches else None
            key = {GRAPH_FUSION: "graph_fusion", UB_FUSION: "ub_fusion"}.get(cat, "other")
            by_cat[key][name] = self.passes[name].to_dict()
        out: dict[str, Any] = {"target": self.target_name, **by_cat, "kernels": self.kernels}
        out.update(self.sections)
        return out

    def write(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2, default=str)
            f.write("\n")
