"""Precision repair by measurement: a 16-bit build that does not agree with its reference is rebuilt with the
kernel whose 16-bit output drifts kept in float32, and checked again, until it agrees.

CANN's keep-lists (softmax, norms, ...) are written by hand for typical models; a model whose activations leave
fp16's range in some other op (a GEMM whose outputs exceed 65504 becomes inf, and the LayerNorm after it NaN)
fails with them. Here ``--verify`` measures: the bisection replays each kernel of the build on the build's own
inputs against its unscheduled float32 form, and names the first kernel whose output differs beyond the 16-bit
tolerance (or, when every kernel is within it and the error only builds up, the kernel with the largest
error). That kernel's outputs are kept in float32 (``PrecisionPlan.keep_kernels``; its ops still compute in
float32 as every kernel does) and the model is built and checked again, at most ``MAX_REPAIRS`` times. The
report lists each kernel kept, its ops and the drift measured (``precision.repair``).
"""

from __future__ import annotations

from typing import Callable

MAX_REPAIRS = 6


def culprit(result) -> tuple[str | None, float | None]:
    """(kernel name as the schedule phase named it, its measured relative error) from a failed verification."""
    v = result.verification
    b = (v.bisection or {}) if v is not None else {}
    bad = b.get("first_bad_kernel")
    if bad:
        name, drift = bad["kernel"], max((o["max_rel"] for o in bad.get("outputs", [])), default=None)
    else:
        name, drift = b.get("worst_kernel"), b.get("worst_max_rel")
    if name is None:
        return None, None
    rows = {k["name"]: k for k in result.report.kernels}
    return rows.get(name, {}).get("source_kernel", name), drift


def repair_precision(result, rebuild: Callable, check: Callable):
    """``result``: a verified 16-bit build (``CompileResult``); ``rebuild(keep_kernels)`` compiles again with
    those kernels' outputs in float32; ``check(result)`` verifies it. Returns the last build."""
    keep: list[str] = []
    kept: list[dict] = []
    while not result.verification.ok and len(keep) < MAX_REPAIRS:
        kernel, drift = culprit(result)
        if kernel is None or kernel in keep:
            break
        worst = max(result.verification.outputs, key=lambda o: o.max_rel)
        row = next((k for k in result.report.kernels if k.get("source_kernel", k["name"]) == kernel), {})
        keep.append(kernel)
        kept.append({"kernel": kernel, "ops": row.get("ops"), "kernel_max_rel": drift,
                     "model_max_rel_before": worst.max_rel, "model_cosine_before": worst.cosine})
        result = rebuild(frozenset(keep))
        result.verification = check(result)
    if kept:
        worst = max(result.verification.outputs, key=lambda o: o.max_rel)
        section = result.report.sections.setdefault("precision", {})
        section["repair"] = {"kept_fp32": kept, "ok": result.verification.ok,
                             "model_max_rel_after": worst.max_rel, "model_cosine_after": worst.cosine}
    return result
