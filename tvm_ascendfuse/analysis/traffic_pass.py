"""Put the per-model traffic table (ours, TVM default fusion, compulsory lower bound) into the report.

``TrafficBaseline`` (opt-in: ``compile_model(..., traffic_baseline=True)``, on in ``ascendfuse compile``)
runs first in the pipeline, on the module as it enters it (the import, before graph fusion): it counts what
TVM's default fusion (``relax.get_default_pipeline``: LegalizeOps, AnnotateTIROpPattern, FoldConstant,
FuseOps, FuseTIR) would launch, and the compulsory bytes. ``benchmarks/fusion_traffic.py`` uses the same
definition (``baseline_rows`` on the import). ``TrafficAccounting`` runs after FuseTIR and counts our
kernels (always: it is cheap). All times are modeled NPU times; bytes are counted on the TIR (``traffic.py``).
Because the lower bound counts the parameters as imported, a model whose graph fusion folds parameters
away (BatchNorm into the conv weights) can count slightly fewer bytes than it (ratio just under 1).

The baseline is report-only and costs a second legalization and fusion of the whole model (seconds on
ResNet-50), which is why a plain compile skips it.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu

from ..legalize import legalize_ops
from ..passbase import PyPass
from ..report import FusionReport
from .traffic import lower_bound, traffic_summary


def tvm_default_fusion(mod: tvm.IRModule, tvm_target) -> tvm.IRModule:
    """TVM's default CPU pipeline up to and including FuseTIR."""
    # cpu.legalize_passes with the LegalizeOps the pipeline runs (the same kernels, without TOPI's warnings)
    legalize = [legalize_ops(), relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
                relax.transform.FuseOps(), relax.transform.FuseTIR()]
    with tvm_target:
        seq = [*cpu.library_dispatch_passes(tvm_target), *legalize]
        return relax.transform.DeadCodeElimination()(tvm.transform.Sequential(seq)(mod))


def _brief(summary: dict) -> dict:
    return {"launches": summary["launches"], "gm_bytes": summary["gm_bytes"],
            "modeled_time_us": summary["modeled_time_us"]}


BASELINE_INPUT = "imported module, before graph fusion"


def baseline_rows(original: tvm.IRModule, npu, tvm_target) -> dict:
    """``tvm_default`` and ``lower_bound`` rows for the module as imported (one definition for the pipeline's
    report and the benchmarks)."""
    default = traffic_summary(tvm_default_fusion(original, tvm_target), npu)
    return {"tvm_default": _brief(default), "lower_bound": lower_bound(original, npu),
            "tvm_default_assumptions": default["assumptions"]}


def traffic_table(original: tvm.IRModule, ours_fused: tvm.IRModule, target, tvm_target=None) -> dict:
    """The three rows of the traffic table for one model (for benchmarks: ``original`` is the import)."""
    from ..target import get_target

    npu = get_target(target)
    tvm_target = tvm_target or npu.host_target(portable=True)
    ours = traffic_summary(ours_fused, npu)
    base = baseline_rows(original, npu, tvm_target)
    default, lb = base["tvm_default"], base["lower_bound"]
    return {
        "ours": _brief(ours), "tvm_default": default, "lower_bound": lb,
        "gm_bytes_vs_lower_bound": round(ours["gm_bytes"] / lb["gm_bytes"], 4) if lb["gm_bytes"] else None,
        "modeled_speedup_vs_tvm_default": round(default["modeled_time_us"] / ours["modeled_time_us"], 4)
        if ours["modeled_time_us"] else None,
        "assumptions": sorted(set(ours["assumptions"]) | set(base["tvm_default_assumptions"])),
        "baseline_input": BASELINE_INPUT,
        "kernels": ours["kernels"],
    }


class TrafficBaseline(PyPass):
    """Counts TVM's default fusion and the lower bound on the module entering the pipeline (the import)."""

    def __init__(self, target, report: FusionReport, tvm_target):
        self.target, self.report, self.tvm_target = target, report, tvm_target

    def pass_name(self) -> str:
        return "AscendTrafficBaseline"

    def transform_module(self, mod):
        sec = self.report.sections.setdefault("traffic", {})
        try:
            base = baseline_rows(mod, self.target, self.tvm_target)
            sec["tvm_default"], sec["lower_bound"] = base["tvm_default"], base["lower_bound"]
            sec["baseline_input"] = BASELINE_INPUT
        except Exception as err:   # the baseline is informative only; never fail a compile over it
            sec["tvm_default"] = {"error": f"{type(err).__name__}: {err}"[:300]}
        return mod


class TrafficAccounting(PyPass):
    """Counts our kernels after FuseTIR and completes ``report.sections['traffic']``. ``plan``: the build's
    precision plan; its 16-bit tensors are counted in 16-bit bytes (``precision/gm_dtypes.py``)."""

    def __init__(self, target, report: FusionReport, plan=None):
        self.target, self.report, self.plan = target, report, plan

    def pass_name(self) -> str:
        return "AscendTrafficAccounting"

    def transform_module(self, mod):
        sec = self.report.sections.setdefault("traffic", {})
        widths = None
        if self.plan is not None:
            from ..precision.gm_dtypes import gm_element_bytes

            widths = gm_element_bytes(self.plan, {k["name"]: k.get("ops") for k in self.report.kernels})
        ours = traffic_summary(mod, self.target, widths)
        if widths is not None:
            sec["gm_storage_dtype"] = self.plan.storage_dtype
        sec["ours"] = _brief(ours)
        sec["kernels"] = ours["kernels"]
        sec["assumptions"] = ours["assumptions"]
        lb = sec.get("lower_bound", {}).get("gm_bytes")
        if lb:
            sec["gm_bytes_vs_lower_bound"] = round(ours["gm_bytes"] / lb, 4)
        d = sec.get("tvm_default", {}).get("modeled_time_us")
        if d and ours["modeled_time_us"]:
            sec["modeled_speedup_vs_tvm_default"] = round(d / ours["modeled_time_us"], 4)
        return mod
