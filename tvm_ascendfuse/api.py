"""One call for the common case: a Relax module in, a VM executable and a fusion report out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import tvm

from .build import build
from .pipeline import AscendFusePipeline
from .precision import resolve_mode
from .report import FusionReport
from .target import AscendTarget, get_target


@dataclass
class CompileResult:
    executable: "tvm.relax.VMExecutable"
    report: FusionReport
    fused_module: tvm.IRModule      # after UB fusion: one PrimFunc per group (names as in the grouping report)
    scheduled_module: tvm.IRModule  # after scheduling and UB verification (kernel names as in report.kernels)
    target: AscendTarget
    host_target: "tvm.target.Target"
    verification: Any = None        # verify.VerifyResult when compiled with verify=True


def compile_model(mod: tvm.IRModule, target: str | AscendTarget = "ascend910b", switches=None,
                  portable: bool = False, traffic_baseline: bool = False, jobs: int | None = None,
                  verify: bool = False, reference: Callable | None = None,
                  reference_name: str | None = None, precision_mode: str | None = None,
                  precision_repair: bool = True) -> CompileResult:
    """``traffic_baseline=True`` also fills the TVM-default and lower-bound rows of the report's traffic table
    (report-only; it re-runs TVM's default fusion on the model, seconds on ResNet-50). ``jobs``: threads
    for the kernels' TIR lowering and LLVM code generation (default: the host's cores; ``build.py``).

    ``verify=True`` runs the build and an unfused reference on seeded random inputs and, on a mismatch, names
    the first kernel that differs from its unfused ops (``verify.py``; result in ``.verification`` and the
    report's ``verify`` section). ``precision_mode``: CANN's names (``precision/modes.py``; default
    ``must_keep_origin_dtype``); with ``verify``, a 16-bit build that does not agree is rebuilt with the
    drifting kernels' outputs kept in float32 until it does (``precision/repair.py``; ``precision_repair=False``
    reports the mismatch instead). ``reference``: a function inputs -> outputs (e.g.
    ``verify.onnxruntime_reference(model)``); default TVM's default pipeline on ``mod``."""
    npu = get_target(target)
    resolve_mode(precision_mode, npu)     # a mode the target cannot run fails here, before any work

    def build_once(keep=frozenset()) -> CompileResult:
        host = npu.host_target(portable=portable)
        pipeline = AscendFusePipeline(npu, switches, traffic_baseline=traffic_baseline,
                                      precision_mode=precision_mode, precision_keep=keep)
        timings: dict = {}
        ex = build(mod, host, pipeline, jobs=jobs, timings=timings)
        record_build_times(pipeline.report, timings)
        if mod.attrs is not None and "ascendfuse.frontend" in mod.attrs:
            # what the ONNX frontend repaired before import (frontend.import_onnx)
            pipeline.report.sections["frontend"] = _plain(mod.attrs["ascendfuse.frontend"])
        snaps = pipeline.snapshots
        return CompileResult(ex, pipeline.report, snaps.get("ub_fusion", mod), snaps.get("verify", mod), npu, host)

    result = build_once()
    if verify:
        from .verify import storage_dtype, verify_compiled

        def check(res):
            return verify_compiled(res, mod, reference, reference_name)

        result.verification = check(result)
        if precision_repair and not result.verification.ok and storage_dtype(result) is not None:
            from .precision.repair import repair_precision

            result = repair_precision(result, build_once, check)
    return result


# Kernels named in the report's ``build`` section, slowest first.
SLOWEST_SHOWN = 10


def record_build_times(report: FusionReport, timings: dict) -> None:
    """Per-kernel TIR/LLVM build seconds into the report: ``build`` (total, threads, every kernel, the
    slowest first) and ``build_seconds`` on each kernel row."""
    seconds = timings.get("kernels") or {}
    if not seconds:
        return
    rules = {k["name"]: k.get("rule") for k in report.kernels}
    slowest = sorted(seconds.items(), key=lambda kv: -kv[1])[:SLOWEST_SHOWN]
    report.sections["build"] = {
        "tir_build_seconds": timings.get("tir_build_seconds"), "jobs": timings.get("jobs"),
        "slowest_kernels": [{"name": n, "seconds": s, "rule": rules.get(n)} for n, s in slowest],
        "kernel_seconds": dict(seconds)}
    for row in report.kernels:
        if row["name"] in seconds:
            row["build_seconds"] = seconds[row["name"]]


def _plain(value):
    """A TVM attribute value (Map/Array/String/IntImm) as plain Python, for the JSON report."""
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return [_plain(v) for v in value]
    if hasattr(value, "value"):
        return value.value
    return value if isinstance(value, (int, float, bool)) else str(value)
