"""The schedule phase: every unscheduled kernel gets the first rule that accepts it.

Rules are tried in ``DEFAULT_RULES`` order (most specific first, the fallback last). A rule declines by
returning None. A rule that raises has a bug: the error is recorded in the report (``rule_errors``: per
kernel, the rule and the error) and the next rule is tried, so a rule bug costs speed, never the build. The
function keeps its attrs and is marked ``tirx.is_scheduled``; the report gets the rule per kernel and the
notes the rules made (``schedule_notes``).

A schedule is only taken when its on-chip buffers fit the target (counted on the scheduled TIR, as the
verification phase counts them), so capacity never aborts a build. One that does not fit is tried again with
smaller tiles: the rule sizes its tiles from the target, so it is asked again for a target whose overflowing
buffer is as much smaller as the schedule was too big (then half that). If that does not fit either, the next
rule is tried (the fallback rule stages nothing on chip). Each such kernel is recorded under
``ub_overflow_recovered`` with the bytes and what was done. Every schedule's vector widths and unrolling are
bounded so that no kernel's code explodes in LLVM (``code_size.py``; what it changed is noted too).
"""

from __future__ import annotations

import dataclasses

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ..analysis.ub_usage import (ON_CHIP_SCOPES, Overflow, canonical_scope, first_overflow, kernel_usage,
                                 normalize_scope_aliases)
from ..passbase import PyPass
from ..progress import bar
from ..report import FusionReport
from ..precision.on_chip import kernel_target
from ..target import AscendTarget, get_target
from .analysis import reduction_kinds
from .attention import AttentionRule
from .base import Declined, Scheduled
from .attention_projection import AttentionProjectionRule
from .chained_gemm import ChainedGemmRule
from .code_size import bound_code_size
from .common import host_of, unwritten_output
from .conv import Conv2dRule
from .conv_int8 import Int8Conv2dRule
from .decode_attention import DecodeAttentionRule
from .depthwise_conv import DepthwiseConv2dRule
from .elementwise import ElementwiseRule
from .fallback import FallbackRule
from .fast_math import use_fast_math
from .flash_decode import FlashDecodeRule
from .grouped_conv import GroupedConv2dRule
from .gemv import GemvRule
from .row_dot import RowDotRule
from .indices import simplify_indices
from .matmul import MatmulRule
from .matmul_bf16 import Bf16MatmulRule
from .matmul_int8 import Int8MatmulRule
from .multi_gemm import MultiGemmRule
from .padded_conv import PaddedConv2dRule
from .prepack import PrepackConstantWeights
from .pool import PoolRule
from .recurrence import RecurrenceRule
from .reduction import GemmNormRule, ReductionRule
from .squeeze_excite import SqueezeExciteRule
from .tuned import tuned_rules
from .write_once import output_races

# Most specific first. The kernels a converter or graph pass wrote themselves, recognised by their blocks or
# tag, before all: a whole recurrent layer, the flash-decoding attention. Squeeze-excite (a spatial sum then two
# small products) before everything that takes products; then products of a few rows and attention of a few
# query rows (a decode step: memory-bound, whatever else the kernel holds). Attention (two products around a
# softmax) and several independent products (SwiGLU) precede the single-GEMM rule, which would otherwise treat
# one product as another's prologue.
DEFAULT_RULES = (RecurrenceRule, FlashDecodeRule, SqueezeExciteRule, GemvRule, DecodeAttentionRule, RowDotRule,
                 AttentionProjectionRule, AttentionRule, ChainedGemmRule, MultiGemmRule, Int8MatmulRule, Bf16MatmulRule,
                 MatmulRule,
                 Int8Conv2dRule, PaddedConv2dRule, Conv2dRule,
                 GroupedConv2dRule, DepthwiseConv2dRule, PoolRule,
                 GemmNormRule, ReductionRule, ElementwiseRule, FallbackRule)


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


def _on_chip(name: str, func: tirx.PrimFunc, target: AscendTarget) -> tuple[bool, Overflow | None]:
    """(an on-chip buffer has a symbolic size, the first on-chip scope the schedule overfills) of a scheduled
    kernel. A rule's tile analysis can miss a case (a GEMM epilogue whose per-tile region is the whole
    result); the verification phase would fail the build on it, so the schedule phase checks first."""
    if not _has_on_chip_scope(func):
        return False, None          # skips the buffer-compaction analysis (milliseconds per kernel)
    usage = kernel_usage(name, func, target)
    symbolic = not _all_static(func) and any(a.nbytes is None for a in usage.allocations)
    return symbolic, first_overflow(usage, target)


def _has_on_chip_scope(func: tirx.PrimFunc) -> bool:
    found = []

    def on_block(block):
        found.extend(b for b in block.alloc_buffers if canonical_scope(b.scope()) in ON_CHIP_SCOPES)

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, on_block)], order="pre")
    return bool(found)


def shrunk(target: AscendTarget, over: Overflow, factor: float) -> AscendTarget:
    """``target`` with the overflowing scope's capacity cut to ``factor`` x (available / needed) of it, so a
    rule that sizes its tiles from the target picks tiles that many times smaller."""
    scale = factor * over.available / max(1, over.needed)
    key = over.scope.lower().split(".")[-1]
    if key == "ub":
        usable = max(target.ub_align, int(target.ub_usable * scale))
        return dataclasses.replace(target, ub_reserved_bytes=target.ub_bytes - usable)
    field = {"l1": "l1_bytes", "l0a": "l0a_bytes", "l0b": "l0b_bytes", "l0c": "l0c_bytes"}[key]
    return dataclasses.replace(target, **{field: max(1, int(getattr(target, field) * scale))})


# smaller-tile retries of a schedule over capacity: (available / needed) x 0.9, then half of that
RETRY_FACTORS = (0.9, 0.45)


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


def prepared_kernel(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """The kernel as every rule reads it: scope aliases normalised, fast math, and reshape indices simplified
    (an unsimplified ``% rows`` made an epilogue read every row of a tile column and its accumulator spill out
    of the tile, ``indices.py``). The tuner keys its workloads by the same form (``tune/kernels.py``)."""
    return simplify_indices(use_fast_math(normalize_scope_aliases(func)))


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
        """(new function, rule name, notes, rule errors, overflows, races) for one kernel; the function is
        unchanged when no rule fits. A rule error is ``{"rule": name, "message": the exception}``; an overflow
        the record of a schedule over on-chip capacity and what was done about it (``ub_overflow_recovered``);
        a race the record of a schedule refused because a block writing an output runs some point of its
        domain twice or writes an element twice, or one writing a buffer of the kernel's own runs a point twice
        within a copy of it (``write_races_refused``, ``write_once.py``)."""
        notes, errors, overflows, races = [], [], [], []
        prepared = prepared_kernel(func)
        # the rules size tiles in the bytes the kernel's tensors take on the NPU (16 bits under a 16-bit plan)
        target = kernel_target(self.target, func)
        products = product_blocks(prepared)
        for rule in self._rules(host):
            if products < rule.min_products:
                continue
            result = self._attempt(rule, prepared, target, host, errors)
            if result is None:
                continue
            if isinstance(result, Declined):
                notes.append(f"{rule.name}: {result.reason}")
                continue
            new = result.sch.mod["main"]
            symbolic, over = _on_chip(name, new, target)
            if symbolic:
                # TVM cannot lower an on-chip (tagged) buffer of symbolic size ("Special tagged memory must be
                # const size"): a rule that left one, e.g. a full symbolic-length row staged in UB, declines.
                notes.append(f"{rule.name}: declined, an on-chip buffer has a symbolic size")
                continue
            if over is not None:
                record = {**over.to_dict(), "rule": rule.name}
                overflows.append(record)
                retried = self._smaller_tiles(rule, prepared, name, host, over, errors, target)
                if retried is None:
                    record["action"] = "next_rule"
                    notes.append(f"{rule.name}: declined, its schedule needs {over.needed} bytes of {over.scope} "
                                 f"(the target has {over.available}), also with smaller tiles")
                    continue
                result, smaller = retried
                record.update(action="smaller_tiles", scheduled_for_bytes=smaller.capacity(over.scope))
                new = result.sch.mod["main"]
            wide = _wide_packed_on_chip(new)
            if wide is not None:
                notes.append(f"{rule.name}: declined, on-chip buffer {wide} has elements wider than 32 bits "
                             "next to other buffers of its scope (TVM packs them at 32-bit offsets)")
                continue
            short = unwritten_output(new)
            if short is not None:
                out, written, size = short
                notes.append(f"{rule.name}: declined, its schedule writes {written} of the {size} elements of "
                             f"output {out} (an epilogue placed per tile over part of its range)")
                continue
            race = self._race(name, rule, result.sch, errors)
            if race is not None:
                races.append(race)
                notes.append(f"{rule.name}: declined, {race['message']}")
                continue
            for key, value in (func.attrs or {}).items():
                new = new.with_attr(key, value)
            if result.note:
                notes.append(result.note)
            # whichever rule made it: no vector or unrolled nest that makes LLVM's time explode (code_size.py)
            new, size_notes = bound_code_size(new, host)
            notes += size_notes
            for record in overflows + races:
                record["final_rule"] = rule.name
            return new.with_attr("tirx.is_scheduled", True), rule.name, notes, errors, overflows, races
        for record in overflows + races:
            record["final_rule"] = None     # left to TVM's lowering as it is (no on-chip buffers)
        return func, None, notes, errors, overflows, races

    @staticmethod
    def _race(name: str, rule, sch, errors) -> dict | None:
        """The record of the first block of a rule's schedule that ``write_once.output_races`` reports (two
        tasks writing one element, one of them from data it did not compute, is a race no numerical check is
        sure to see), else None. A failure of the check itself is recorded as a rule error, not a refusal."""
        try:
            found = output_races(sch)
        except Exception as err:  # noqa: BLE001 - the check's bug must not cost the build
            errors.append({"rule": f"{rule.name} (write-once check)", "message": _message(err)})
            return None
        if not found:
            return None
        race = found[0]
        c = race.counts
        return {"kernel": name, "rule": rule.name, "block": race.block, "buffer": race.buffer,
                "buffer_is_output": race.output, "domain_points": c.domain, "points_run_twice": c.twice,
                "points_missed": c.missed, "iterations_outside": c.outside,
                "elements_written_twice": race.elements_twice, "blocks": len(found),
                "message": f"kernel {name}: its {race.describe()}"
                           + (f" ({len(found) - 1} more such block(s))" if len(found) > 1 else "")}

    def _attempt(self, rule, prepared, target, host, errors):
        try:
            return rule.apply_with_note(prepared, target, host)
        except Exception as err:  # noqa: BLE001 - a rule bug: reported, and the next rule is tried
            errors.append({"rule": rule.name, "message": _message(err)})
            return None

    def _smaller_tiles(self, rule, prepared, name, host, over: Overflow, errors, target):
        """(schedule, the target it was sized for) of ``rule`` asked again with less of the overflowing
        buffer, when it then fits the real target; else None."""
        for factor in RETRY_FACTORS:
            smaller = shrunk(target, over, factor)
            result = self._attempt(rule, prepared, smaller, host, errors)
            if not isinstance(result, Scheduled):
                return None     # declined for the smaller buffer
            symbolic, again = _on_chip(name, result.sch.mod["main"], target)
            if not symbolic and again is None:
                return result, smaller
        return None

    def transform_module(self, mod):
        host = host_of(self.host)
        chosen, all_notes, all_errors, all_overflows, all_races = {}, {}, {}, [], []
        todo = [(gv, func) for gv, func in mod.functions.items() if isinstance(func, tirx.PrimFunc)
                and not (func.attrs is not None and "tirx.is_scheduled" in func.attrs)]
        # on a terminal, a bar once scheduling takes more than two seconds (large models)
        with bar(total=len(todo), desc="scheduling", unit="kernel", delay=2.0) as shown:
            results = []
            for gv, func in todo:
                results.append((gv, func, *self.schedule_one(gv.name_hint, func, host)))
                shown.update()
        for gv, func, new, rule, notes, errors, overflows, races in results:
            all_overflows += overflows
            all_races += races
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
            if all_overflows:
                self.report.sections.setdefault("ub_overflow_recovered", []).extend(all_overflows)
            if all_races:
                self.report.sections.setdefault("write_races_refused", []).extend(all_races)
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
        first_inverse = {v: k for k, v in first.items()}
        sections = self.report.sections
        for key in ("schedules", "schedule_notes", "rule_errors"):
            if key in sections:
                sections[key] = {final.get(k, k): v for k, v in sections[key].items()}
        for record in sections.get("ub_overflow_recovered", []) + sections.get("write_races_refused", []):
            if record.get("kernel") in final and "source_kernel" not in record:
                record["source_kernel"] = first_inverse.get(record["kernel"], record["kernel"])
                record["kernel"] = final[record["kernel"]]
        rules = sections.get("schedules", {})
        for row in self.report.kernels:
            name = final.get(first.get(row.get("name"), row.get("name")), row.get("name"))
            if name != row.get("name"):
                row["source_name"] = row["name"]
                row["name"] = name
            if name in rules:
                row["rule"] = rules[name]
