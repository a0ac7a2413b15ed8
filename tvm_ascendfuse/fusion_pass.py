"""Base class of our switchable passes.

Each instance is a real ``tvm.transform.Pass`` (usable in any ``Sequential``) named after its CANN switch.
A switched-off pass still runs its matcher, so the report can say what it *would* have fused; such an
instance is named ``<switch>.off`` so that ``PassContext(disabled_pass=[<switch>])`` does not skip the
counting.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .passbase import PyPass

from .report import SWITCHED_OFF, FusionReport
from .target import AscendTarget, current_target_from_tvm, get_target


class FusionPass(PyPass):
    """Subclasses set ``switch_name`` and override ``transform_function`` (or ``transform_module``).

    Inside, call ``self.take(where, **detail)`` for each match: it records the match and returns whether
    to rewrite (False when switched off). ``self.refuse(reason, where, **detail)`` records a match that a
    check rejected.
    """

    switch_name: str = ""

    def __init__(self, target: AscendTarget | str | None = None, report: FusionReport | None = None,
                 enabled: bool = True):
        self._target_spec = target
        self.report = report if report is not None else FusionReport()
        self.enabled = enabled

    def pass_name(self) -> str:
        return self.switch_name if self.enabled else f"{self.switch_name}.off"

    @property
    def target(self) -> AscendTarget:
        """The explicit target, else the preset named by the enclosing TVM target, else ascend910b."""
        if self._target_spec is not None:
            return get_target(self._target_spec)
        return current_target_from_tvm() or get_target("ascend910b")

    # ---- recording ----------------------------------------------------------------------------------
    def take(self, where: str | None = None, **detail) -> bool:
        if self.enabled:
            self.report.record(self.switch_name, True, where=where, **detail)
            return True
        self.report.record(self.switch_name, False, SWITCHED_OFF, where=where, **detail)
        return False

    def refuse(self, reason: str, where: str | None = None, **detail) -> None:
        self.report.record(self.switch_name, False, reason, where=where, **detail)

    # ---- rewriting ----------------------------------------------------------------------------------
    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        self.report.touch(self.switch_name)
        updates = {}
        for gv, func in mod.functions.items():
            if isinstance(func, relax.Function) and not is_primitive(func):
                new = self.transform_function(func, mod)
                if new is not None and not new.same_as(func):
                    updates[gv] = new
        if not updates:
            return mod
        mod = mod.clone() if hasattr(mod, "clone") else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        for gv, func in updates.items():
            mod[gv] = func
        return relax.transform.DeadCodeElimination()(mod)

    def transform_function(self, func: relax.Function, mod: tvm.IRModule) -> relax.Function:
        raise NotImplementedError(f"{type(self).__name__} must override transform_function")


def is_primitive(func) -> bool:
    return bool(func.attrs) and ("Primitive" in func.attrs or "Composite" in func.attrs)
