"""UB fusion, part (b): cost-based grouping of the call_tirs no pattern took (replaces TVM's FuseOps).

Runs after LegalizeOps / AnnotateTIROpPattern. For every dataflow block of every non-primitive function:
build the block's graph (``graph.py``), run the priority-fusion queue over it (``queue.py``, deciding with
``model.py``), and emit its groups as private ``Primitive`` functions (``emit.py``), which FuseTIR turns into
one PrimFunc each. Every candidate still open at the end is recorded in the report with the reason it was
not taken; if the grouping itself fails on some construct, TVM's FuseOps groups the module instead (recorded).
"""

from __future__ import annotations

import dataclasses
import time
import warnings

import tvm
from tvm import relax

from ..analysis.traffic import ASSUMED_SYMBOLIC_DIM
from ..passbase import PyPass
from ..report import CHECK_FAILED, FusionReport
from ..switches import COST_BASED_FUSION
from ..target import AscendTarget, current_target_from_tvm, get_target
from .cost import GroupingConfig
from .emit import emit_block
from .graph import build_graph
from .model import FusionModel
from .queue import FusionQueue


class CostBasedFusionPass(PyPass):
    """The grouping pass. ``report.sections['grouping']`` gets one row per emitted group."""

    switch_name = COST_BASED_FUSION

    def __init__(self, target: AscendTarget | str | None = None, report: FusionReport | None = None,
                 config: GroupingConfig | None = None):
        self._target_spec = target
        self.report = report if report is not None else FusionReport()
        self.config = config or GroupingConfig()

    def pass_name(self) -> str:
        return "CostBasedFusionPass"

    @property
    def target(self) -> AscendTarget:
        if callable(self._target_spec):
            # a target known only when the pass runs (the precision plan's on-chip dtype, ``pipeline.py``)
            return self._target_spec()
        if self._target_spec is not None:
            return get_target(self._target_spec)
        return current_target_from_tvm() or get_target("ascend910b")

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        """Group; if the grouping itself fails on some construct, fall back to TVM's FuseOps (recorded)."""
        try:
            return self._transform(mod)
        except Exception as err:  # a grouping bug must not cost the user a compile
            msg = f"{type(err).__name__}: {err}"[:500]
            warnings.warn(f"CostBasedFusionPass failed, falling back to FuseOps: {msg}")
            self.report.record(COST_BASED_FUSION, False, CHECK_FAILED, where="module",
                               why="internal error, FuseOps used", error=msg)
            return relax.transform.FuseOps()(mod)

    def _transform(self, mod: tvm.IRModule) -> tvm.IRModule:
        self.report.touch(COST_BASED_FUSION)
        target = self.target
        bb = relax.BlockBuilder(mod)
        t0 = time.perf_counter()
        section = self.report.sections.setdefault("grouping", {"groups": [], "assumptions": []})
        section["config"] = dataclasses.asdict(self.config)
        section["assumed_symbolic_dim"] = ASSUMED_SYMBOLIC_DIM
        changed = False
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function) or (func.attrs and "Primitive" in func.attrs):
                continue
            if not isinstance(func.body, relax.SeqExpr):
                continue
            new_blocks = []
            for bi, block in enumerate(func.body.blocks):
                if isinstance(block, relax.DataflowBlock):
                    nb = self._group_block(block, func, mod, bb, target, section, f"{gv.name_hint}:{bi}")
                    changed |= nb is not block
                    new_blocks.append(nb)
                else:
                    new_blocks.append(block)
            if changed:
                body = relax.SeqExpr(new_blocks, func.body.body)
                new_func = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
                bb.update_func(gv, new_func)
        st = section.setdefault("stats", {"merges": 0, "call_tirs": 0, "seconds": 0.0})
        st["seconds"] = round(st["seconds"] + time.perf_counter() - t0, 3)
        if not changed:
            return mod
        out = bb.get()
        return relax.transform.DeadCodeElimination()(out)

    def _group_block(self, block, func, mod, bb, target, section, key):
        graph = build_graph(block, func, mod, target, section["assumptions"])
        graph.key = key
        model = FusionModel(graph, target, self.config)
        queue = FusionQueue(graph, model, self.config, target, self.report).run()
        st = section.setdefault("stats", {"merges": 0, "call_tirs": 0, "seconds": 0.0})
        st["merges"] += queue.merges
        st["call_tirs"] += sum(1 for n in graph.nodes if n.call is not None)
        for reason, refused in queue.schedule_refusals.items():
            # distinct merges the rule table refused (no_schedule / slower_schedule), by reason
            st[reason] = st.get(reason, 0) + len(refused)
        return emit_block(block, graph, model, queue, bb, section, target)
