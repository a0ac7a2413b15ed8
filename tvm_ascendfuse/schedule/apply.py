"""The schedule phase: every unscheduled kernel gets the first rule that accepts it.

Rules are tried in ``DEFAULT_RULES`` order (most specific first, the fallback last). A rule declines by
returning None. A rule that raises has a bug: the error is recorded in the report (``rule_errors``: per
kernel, the rule and the error) and the next rule is tried, so a rule bug costs speed, never the build. The
function keeps its attrs and is marked ``tirx.is_scheduled``; the report gets the rule per kernel and the
notes the rules made (``schedule_notes``).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ..analysis.ub_usage import ON_CHIP_SCOPES, canonical_scope, kernel_usage, normalize_scope_aliases
from ..passbase import PyPass
from ..progress import bar
from ..report import FusionReport
from ..target import AscendTarget, get_target
from .analysis import reduction_kinds
from .attention import AttentionRule
from .base import Declined
from .attention_projection import AttentionProjectionRule
from .chained_gemm import ChainedGemmRule
from .common import host_of
from .conv import Conv2dRule
from .depthwise_conv import DepthwiseConv2dRule
from .elementwise import ElementwiseRule
from .fallback import FallbackRule
from .fast_math import use_fast_math
from .grouped_conv import GroupedConv2dRule
from .matmul import MatmulRule
from .multi_gemm import MultiGemmRule
from .prepack import PrepackConstantWeights
from .pool import PoolRule
from .reduction import GemmNormRule, ReductionRule
from .squeeze_excite import SqueezeExciteRule
from .tuned import tuned_rules

# Most specific first. Squeeze-excite (a spatial sum then two small products) before everything that takes
# products. Attention (two products around a softmax) and several independent products
# (SwiGLU) precede the single-GEMM rule, which would otherwise treat one product as another's prologue.
DEFAULT_RULES = (SqueezeExciteRule, AttentionProjectionRule, AttentionRule, ChainedGemmRule, MultiGemmRule, MatmulRule,
                 Conv2dRule, GroupedConv2dRule, DepthwiseConv2dRule, PoolRule, GemmNormRule, ReductionRule,
                 ElementwiseRule, FallbackRule)


def default_rules(target: AscendTarget, host=None) -> list:
    """Tuned records for this target and host CPU first (when ``schedules/<target>/<cpu>/`` holds a database),
    then the rules."""
    return tuned_rules(target.name, host, _prepares())[0] + _rule_instances(DEFAULT_RULES)


def _prepares() -> list:
    """The rules' ``prepare`` rewrites (records of such a rule are keyed by the prepared kernel)."""
    return [r.prepare for r in DEFAULT_RULES if getattr(r, "prepare", None) is not None]


def product_blocks(func: tirx.PrimFunc) -> int:
    """GEMM-like blocks (``analysis.is_product_block``) of a kernel, counted without building a schedule:
    a rule with ``min_products`` above the count is not tried (each rule's own analysis builds a schedule
    first, tens of ms per rule and kernel)."""
    return reduction_kinds(func).count("P")


def _all_static(func: tirx.PrimFunc) -> bool:
    """Every parameter is a buffer of constant shape: then no loop extent or tile can be symbolic."""
    return all(isinstance(p.ty, tirx.BufferType) and all(isinstance(d, tirx.IntImm) for d in p.ty.shape)
               for p in func.params)


def _symbolic_on_chip(name: str, func: tirx.PrimFunc, target: AscendTarget) -> bool:
    if _all_static(func):
        return False    # skips the buffer-compaction analysis (tens of ms per kernel)
    usage = kernel_usage(name, func, target)
    return any(a.nbytes is None for a in usage.allocations)


def _over_capacity(name: str, func: tirx.PrimFunc, target: AscendTarget) -> tuple[str, int, int] | None:
    """(scope, bytes needed, bytes available) of the first on-chip scope the schedule overfills, else None.

    The verification phase would fail the build on it; a rule whose tile analysis missed a case (a GEMM
    epilogue whose per-tile region is the whole result: Swin-T's attention output, transposed across heads
    and reshaped, staged 1.3 MiB in UB) declines instead, and the next rule schedules the kernel."""
    usage = kernel_usage(name, func, target)
    for scope in ON_CHIP_SCOPES:
        needed, available = usage.bytes(scope), target.capacity(scope)
        if needed > available:
            return scope, needed, available
    return None


def _wide_packed_on_chip(func: tirx.PrimFunc) -> str | None:
    """An on-chip buffer of elements wider than 32 bits that shares its scope with another buffer, else None.

    TVM's StorageRewrite packs (and reuses) the buffers of a tagged scope such as ``local.UB`` into one
    allocation at 32-bit granularity; a 64-bit buffer that lands at an offset that is not a multiple of 64
    bits aborts the build ("Check failed: e->bits_offset % elem_bits == 0U"; ONNX NLLLoss's int64 index
    arithmetic staged in UB next to its bool mask)."""
    by_scope: dict[str, list] = {}

    def on_block(block):
        for buf in block.alloc_buffers:
            scope = canonical_scope(buf.scope())
            if scope in ON_CHIP_SCOPES:
                by_scope.setdefault(scope, []).append(buf)

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, on_block)], order="pre")
    for bufs in by_scope.values():
        wide = [b for b in bufs if tvm.DataType(str(b.dtype)).bits * tvm.DataType(str(b.dtype)).lanes > 32]
        if wide and len(bufs) > 1:
            return wide[0].name
    return None


def _rule_instances(rules):
    return [r() if isinstance(r, type) else r for r in rules]


def _message(err: Exception) -> str:
    """``Type: last line`` of an exception (TVM's errors put the message last, after a backtrace)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[-1][:200]}" if lines else type(err).__name__


class ApplyUBSchedules(PyPass):
    """Module pass: schedule each PrimFunc without ``tirx.is_scheduled`` with the first accepting rule."""

    def __init__(self, target: AscendTarget | str | None = None, report: FusionReport | None = None, host=None,
                 rules=None):
        self.target = get_target(target) if not isinstance(target, AscendTarget) else target
        self.report = report
        self.host = host
        # without rules given: the records for the host CPU, looked up when the host is known (transform)
        self.rules = _rule_instances(rules) if rules is not None else None
        self.tuning: dict = {}   # what the report's ``tuning`` section says about the records

    def pass_name(self) -> str:
        return "AscendApplyUBSchedules"

    def _rules(self, host) -> list:
        if self.rules is None:
            tuned, self.tuning = tuned_rules(self.target.name, host, _prepares())
            self.rules = tuned + _rule_instances(DEFAULT_RULES)
        return self.rules

    def schedule_one(self, name: str, func: tirx.PrimFunc, host):
        """(new function, rule name, notes, rule errors) for one kernel; the function is unchanged when no rule
        fits. A rule error is ``{"rule": name, "message": the exception}``."""
        notes, errors = [], []
        prepared = use_fast_math(normalize_scope_aliases(func))
        products = product_blocks(prepared)
        for rule in self._rules(host):
            if products < rule.min_products:
                continue
            try:
                result = rule.apply_with_note(prepared, self.target, host)
            except Exception as err:  # noqa: BLE001 - a rule bug: reported, and the next rule is tried
                errors.append({"rule": rule.name, "message": _message(err)})
                continue
            if result is None:
                continue
            if isinstance(result, Declined):
                notes.append(f"{rule.name}: {result.reason}")
                continue
            new = result.sch.mod["main"]
            if _symbolic_on_chip(name, new, self.target):
                # TVM cannot lower an on-chip (tagged) buffer of symbolic size ("Special tagged memory must be
                # const size"): a rule that left one, e.g. a full symbolic-length row staged in UB, declines.
                notes.append(f"{rule.name}: declined, an on-chip buffer has a symbolic size")
                continue
            over = _over_capacity(name, new, self.target)
            if over is not None:
                scope, needed, available = over
                notes.append(f"{rule.name}: declined, its schedule needs {needed} bytes of {scope} "
                             f"(the target has {available})")
                continue
            wide = _wide_packed_on_chip(new)
            if wide is not None:
                notes.append(f"{rule.name}: declined, on-chip buffer {wide} has elements wider than 32 bits "
                             "next to other buffers of its scope (TVM packs them at 32-bit offsets)")
                continue
            for key, value in (func.attrs or {}).items():
                new = new.with_attr(key, value)
            if result.note:
                notes.append(result.note)
            return new.with_attr("tirx.is_scheduled", True), rule.name, notes, errors
        return func, None, notes, errors

    def transform_module(self, mod):
        host = host_of(self.host)
        chosen, all_notes, all_errors = {}, {}, {}
        todo = [(gv, func) for gv, func in mod.functions.items() if isinstance(func, tirx.PrimFunc)
                and not (func.attrs is not None and "tirx.is_scheduled" in func.attrs)]
        # on a terminal, a bar once scheduling takes more than two seconds (large models)
        with bar(total=len(todo), desc="scheduling", unit="kernel", delay=2.0) as shown:
            results = []
            for gv, func in todo:
                results.append((gv, func, *self.schedule_one(gv.name_hint, func, host)))
                shown.update()
        for gv, func, new, rule, notes, errors in results:
            chosen[gv.name_hint] = rule or "unscheduled"
            if notes:
                all_notes[gv.name_hint] = notes
            if errors:
                all_errors[gv.name_hint] = errors
            if rule is not None:
                mod[gv] = new
        if self.report is not None:
            if self.tuning:
                applied = sum(rule == "tuned" for rule in chosen.values())
                self.report.sections["tuning"] = {**self.tuning, "kernels_tuned": applied}
            self.report.sections.setdefault("schedules", {}).update(chosen)
            if all_notes:
                self.report.sections.setdefault("schedule_notes", {}).update(all_notes)
            if all_errors:
                self.report.sections.setdefault("rule_errors", {}).update(all_errors)
            for row in self.report.kernels:
                if row.get("name") in chosen:
                    row["rule"] = chosen[row["name"]]
        return mod


class ScheduleKernels(PyPass):
    """The schedule phase as one pass: mark constant weights layout-free, apply the rules, then pack those
    weights once at compile time (a rule may re-lay a weight out; ``schedule/layout.py``).

    TVM's layout-free and prepack passes rename kernels (``k`` -> ``k1`` -> ``k1_prepacked``); the report's
    kernel rows and schedule sections are re-keyed to the final names, which are what the executable runs.
    """

    def __init__(self, target, report: FusionReport | None = None, host=None, rules=None):
        self.target, self.report, self.host, self.rules = target, report, host, rules

    def pass_name(self) -> str:
        return "AscendScheduleKernels"

    def transform_module(self, mod):
        from tvm import relax

        from ..analysis import launched_kernels

        before = launched_kernels(mod)
        mod = relax.transform.AttachAttrLayoutFreeBuffers()(mod)
        mid = launched_kernels(mod)
        mod = ApplyUBSchedules(self.target, self.report, self.host, self.rules)(mod)
        try:
            mod = PrepackConstantWeights()(mod)
        except Exception as err:  # noqa: BLE001
            # TVM's split aborts on a module holding a PrimFunc without compute blocks (the shape_func of an
            # ONNX Slice/Unsqueeze with runtime starts/axes: "There should be a compute block if there is
            # only one subtree under the root"). Unsplit, a weight re-layout runs inside its kernel: slower,
            # same numbers.
            if self.report is not None:
                self.report.sections.setdefault("schedule_notes", {})["module"] = [
                    f"weight pre-packing skipped: {str(err).strip().splitlines()[-1][:200]}"]
        mod = relax.transform.DeadCodeElimination()(mod)
        after = launched_kernels(mod)
        if self.report is not None:
            self._rekey(before, mid, after)
        return mod

    def _rekey(self, before, mid, after):
        first = dict(zip(before, mid)) if len(before) == len(mid) else {}
        final = dict(zip(mid, after)) if len(mid) == len(after) else {}
        sections = self.report.sections
        for key in ("schedules", "schedule_notes", "rule_errors"):
            if key in sections:
                sections[key] = {final.get(k, k): v for k, v in sections[key].items()}
        rules = sections.get("schedules", {})
        for row in self.report.kernels:
            name = final.get(first.get(row.get("name"), row.get("name")), row.get("name"))
            if name != row.get("name"):
                row["source_name"] = row["name"]
                row["name"] = name
            if name in rules:
                row["rule"] = rules[name]
