"""The ``ascendfuse`` Relax pipeline: its phases, in order, and nothing else.

    tvm.compile(mod, target=AscendTarget.host_target(), relax_pipeline="ascendfuse")

Every phase reads one AscendTarget and records into one FusionReport.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu

from .analysis import groups_before_fuse_tir, kernel_table, symbolic_sizes
from .analysis.traffic_pass import TrafficAccounting, TrafficBaseline
from .analysis.verify_ub import VerifyUBCapacity
from .graph_fusion import GRAPH_FUSION_PASSES, MatMulSiblingMergeFusionPass
from .gather_bounds import GatherBoundsCheck
from .graph_fusion.safe_fold import SafeFoldConstant
from .errors import AscendFuseError
from .grouping import CostBasedFusionPass, GroupingConfig, PatternFusionPass
from .legalize import explain_failure, legalize_ops
from .passbase import PyPass
from .precision import ClampCallsAsOpsPass, Float32ComputePass, PrecisionPlan, RoundWeightsPass, SixteenBitStoragePass, resolve_mode
from .precision.on_chip import MarkOnChipDtype, grouping_target
from .progress import bar
from .report import FusionReport
from .report_graph import record_after, record_before
from .schedule.apply import ScheduleKernels
from .schedule.task_prefetch import TaskPrefetch
from .switches import (ATTENTION_PROJECTION, CHAINED_GEMM, CHAINED_GEMM_HOST, COST_BASED_FUSION, SCHEDULE_RULE_CHECK,
                       TASK_PREFETCH, resolve_switches)
from .target import AscendTarget, current_target_from_tvm, get_target


def traffic_baseline_phase(target, report, tvm_target):
    """Phase 0 (opt-in, report-only): what TVM's default fusion would launch and move, and the compulsory
    bytes, counted on the module as it enters the pipeline."""
    return [TrafficBaseline(target, report, tvm_target)]


def precision_phase(report, plan):
    """Phase 0b: a model stored in 16-bit floats computed in float32 (the host has no 16-bit arithmetic; the
    importer's clamp PrimFuncs first become ops the widening can convert);
    its 16-bit storage between kernels comes back after scheduling (``schedule_phase``)."""
    return [ClampCallsAsOpsPass(report), Float32ComputePass(report, plan)]


def graph_fusion_phase(target, switches, report):
    """Phase 1: math-equivalent rewrites (BN folding, bias merges, Focus, norm recognition, split)."""
    options = {MatMulSiblingMergeFusionPass: {"query_apart": _query_apart(switches)}}
    # constants first: tables computed from constants (RoPE's cos/sin, masks built in the graph, scales
    # computed with sqrt) are then constants the passes can read; quantized weights stay int8 under their
    # dequantize for the int8 passes (the fold after the list folds what those left)
    passes = [relax.transform.DeadCodeElimination(), SafeFoldConstant(keep=("relax.dequantize",))]
    passes += [cls(target, report, enabled=switches.is_on(cls.switch_name), **options.get(cls, {}))
               for cls in GRAPH_FUSION_PASSES]
    return passes + [SafeFoldConstant(), relax.transform.DeadCodeElimination()]


def input_checks_phase():
    """Phase 1a: run-time checks of what the kernels would otherwise trust: a gather's indices stay inside
    its table, and an index outside it stops the call naming its source (``gather_bounds.py``). First, so
    that no constant folding ever builds the unchecked gather (TOPI warns of a segfault each time)."""
    return [GatherBoundsCheck()]


def _query_apart(switches) -> bool:
    """Whether the sibling merge leaves an attention's query projection apart for the attention kernel.

    Only when that kernel can take it: with chained GEMMs off, a pre-norm block's next norm stays with the
    output projection (which then writes h and norm(h)), the attention kernel (one output) cannot take that
    projection, and a query left apart would only cost one more launch and more GM traffic."""
    return switches.is_on(ATTENTION_PROJECTION) and switches.is_on(CHAINED_GEMM)


def _host_cores(tvm_target) -> int:
    """Cores of the CPU the kernels will run on (0 when the target is not a CPU)."""
    if tvm_target is None or tvm_target.kind.name != "llvm":
        return 0
    return max(1, int(tvm_target.attrs["num-cores"])) if "num-cores" in tvm_target.attrs else 1


def ub_fusion_phase(target, switches, report, tvm_target, forbidden=(), plan=None):
    """Phase 2: pattern groups, legalization, grouping of the rest, one PrimFunc per group.

    The cost-based grouping replaces TVM's FuseOps; FuseOps is the fallback when it is switched off.
    ``forbidden``: groups whose kernels exceeded on-chip capacity in an earlier run (``GroupingConfig``).
    Under a 16-bit plan the grouping counts tiles in 16-bit bytes and the kernels are marked with the dtype
    their tiles have on chip, for the schedule rules and the verification (``precision/on_chip.py``).
    First, under a mode converting float32 to 16 bits, GEMM/conv weights are rounded to 16-bit values: here
    and not in the precision phase, so that weights graph fusion computed (BN folded into a conv) are too."""
    if switches.is_on(COST_BASED_FUSION):
        chained = switches.is_on(CHAINED_GEMM)
        config = GroupingConfig(allow_chained_gemm=chained,
                                allow_attention_projection=switches.is_on(ATTENTION_PROJECTION),
                                chain_host_cores=_host_cores(tvm_target) if switches.is_on(CHAINED_GEMM_HOST) else 0,
                                schedulable_only=switches.is_on(SCHEDULE_RULE_CHECK),
                                forbidden=tuple(forbidden))
        # the plan's 16-bit dtype is known once the precision phase has run (a model stored in fp16): the
        # grouping asks for its target then, and counts its tiles in the bytes they have on the NPU
        spec = (lambda: grouping_target(target, plan)) if plan is not None else target
        grouping = CostBasedFusionPass(spec, report, config)
    else:
        report.touch(COST_BASED_FUSION)
        grouping = relax.transform.FuseOps()
    rounding = [RoundWeightsPass(report, plan)] if plan is not None else []
    marking = [MarkOnChipDtype(report, plan)] if plan is not None else []
    return [
        *rounding,
        PatternFusionPass(target, report, switches),
        *cpu.library_dispatch_passes(tvm_target),
        legalize_ops(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        grouping,
        RecordKernels(report),
        *marking,
        TrafficAccounting(target, report, plan),
    ]


def schedule_phase(target, report, tvm_target, rules=None, plan=None):
    """Phase 3: one UB-tiled schedule per kernel (first accepting rule per kind, only schedules that fit the
    on-chip buffers: else smaller tiles, else the next rule); constant weights that a rule re-lays out are
    packed once at compile time. Then, for a 16-bit precision plan, the tensors between kernels are stored
    in 16 bits (each kernel converts at its loads and stores; ``precision/storage.py``)."""
    storage = [SixteenBitStoragePass(report, plan)] if plan is not None else []
    return [ScheduleKernels(target, report, tvm_target, rules), *storage]


def verification_phase(target, report):
    """Phase 4: on-chip bytes per kernel vs the target's capacity, counted on the TIR that will be built.
    A kernel the schedule phase could only fit by leaving it to the fallback rule (or unscheduled) makes the
    pipeline run phases 2-4 again with its group split (``AscendFusePipeline.transform_module``)."""
    return [VerifyUBCapacity(target, report)]


# Re-runs of phases 2-4 with overflowing groups split, at most (each forbids at least one more group).
MAX_REGROUPS = 3
# Rules a kernel that lost its own rule to an overflow ends on when nothing on chip is tiled any more.
GENERIC_RULES = ("fallback", None)


def prefetch_phase(switches, report):
    """Phase 5: each parallel task of a scheduled kernel prefetches its next task's weights and its own
    epilogue's other input (``schedule/task_prefetch.py``), after the verification so the scheduled module
    the report keeps is the one the rules made."""
    return [TaskPrefetch(report)] if switches.is_on(TASK_PREFETCH) else []


def lowering_phase(tvm_target):
    """Phase 6: TVM's own lowering to the VM, as in its default CPU pipeline after FuseTIR."""
    return [*cpu.dataflow_lower_passes(tvm_target), *cpu.finalize_passes(tvm_target)]


class RecordKernels(PyPass):
    """FuseTIR, noting which source ops and pattern went into each resulting kernel."""

    def __init__(self, report: FusionReport):
        self.report = report

    def pass_name(self) -> str:
        return "AscendFuseTIR"

    def transform_module(self, mod):
        groups = groups_before_fuse_tir(mod)
        record_after(self.report, mod)
        mod = relax.transform.FuseTIR()(mod)
        mod = relax.transform.DeadCodeElimination()(mod)
        self.report.set_kernels(kernel_table(mod, groups))
        entry = [f for gv, f in mod.functions.items() if gv.name_hint == "main"]
        sizes = symbolic_sizes(entry[0]) if entry else []
        if sizes:
            # one build serves every value of these; the kernels' rows say which depend on them
            self.report.sections["symbolic_sizes"] = sizes
        return mod


class AscendFusePipeline(PyPass):
    """The whole pipeline as one pass; ``.report`` holds what it did after it ran.

    ``traffic_baseline=True`` adds the TVM-default rows of the report's traffic table (a second legalization
    and fusion of the model: report-only, off by default so that compiling stays fast). ``rules``: the
    schedule rules to use instead of ``schedule.apply.default_rules`` (instances or classes, in order)."""

    def __init__(self, target: AscendTarget | str | None = None, switches=None,
                 report: FusionReport | None = None, traffic_baseline: bool = False, rules=None,
                 precision_mode: str | None = None, precision_keep=()):
        self._target_spec = target
        self._precision_mode = precision_mode
        self._precision_keep = frozenset(precision_keep)
        self._switch_spec = switches
        self.traffic_baseline = traffic_baseline
        self.rules = rules
        self.report = report if report is not None else FusionReport()
        self.snapshots: dict[str, tvm.IRModule] = {}   # module after each phase, for reports and debugging

    def pass_name(self) -> str:
        return "AscendFusePipeline"

    def resolve(self):
        tvm_target = tvm.target.Target.current(allow_none=True)
        if self._target_spec is not None:
            target = get_target(self._target_spec)
        else:
            target = current_target_from_tvm() or get_target("ascend910b")
        if tvm_target is None:
            tvm_target = target.host_target()
        switches = resolve_switches(self._switch_spec).with_pass_context()
        self.report.target_name = target.name
        self.plan = PrecisionPlan(resolve_mode(self._precision_mode, target), keep_kernels=self._precision_keep)
        return target, switches, tvm_target

    def phases(self, target, switches, tvm_target, forbidden=()):
        r = self.report
        baseline = [("traffic_baseline", traffic_baseline_phase(target, r, tvm_target))] \
            if self.traffic_baseline else []
        return baseline + [
            ("precision", precision_phase(r, self.plan)),
            ("input_checks", input_checks_phase()),
            ("graph_fusion", graph_fusion_phase(target, switches, r)),
            ("ub_fusion", ub_fusion_phase(target, switches, r, tvm_target, forbidden, self.plan)),
            ("schedule", schedule_phase(target, r, tvm_target, self.rules, self.plan)),
            ("verify", verification_phase(target, r)),
            ("prefetch", prefetch_phase(switches, r)),
            ("lowering", lowering_phase(tvm_target)),
        ]

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        """The phases in order. When the schedule phase could only fit a fused kernel by giving it to the
        fallback rule (or leaving it to TVM's lowering) because its rule's schedule did not fit on chip
        (``ub_overflow_recovered``), phases 2-4 run again from the same module with that group forbidden, so
        the grouping makes smaller groups of its ops (at most ``MAX_REGROUPS`` times); the report then says
        which groups were split (``split_group``)."""
        target, switches, tvm_target = self.resolve()
        record_before(self.report, mod)
        self.report.sections["target_capacity"] = {"ub_usable_bytes": target.ub_usable,
                                                   "l1_bytes": target.l1_bytes, "l0c_bytes": target.l0c_bytes}
        forbidden, split = (), []
        phases = self.phases(target, switches, tvm_target)
        with tvm_target, bar(total=len(phases), desc="compile", unit="phase", delay=2.0) as shown:
            i, restart = 0, None
            while i < len(phases):
                name, passes = phases[i]
                shown.set_postfix_str(name)
                if name == "ub_fusion":
                    restart = (i, mod, self.report.checkpoint())
                try:
                    new = tvm.transform.Sequential(passes)(mod)
                except AscendFuseError:
                    raise
                except Exception:
                    # an op TVM cannot lower (input shape known only at run time) fails somewhere inside
                    # TVM; name it instead (legalize.py). Anything else is raised as it is.
                    explained = explain_failure(mod) if name in ("graph_fusion", "ub_fusion") else None
                    if explained is None:
                        raise
                    raise explained from None
                mod = self.snapshots[name] = new
                more = self._groups_to_split(forbidden) if name == "verify" else []
                if more and restart is not None and len(split) < MAX_REGROUPS:
                    split += [record for record, _ in more]
                    forbidden += tuple(entry for _, entry in more)
                    i, mod, state = restart
                    self.report.restore(state)
                    phases = self.phases(target, switches, tvm_target, forbidden)
                    continue
                shown.update()
                i += 1
        if split:
            self.report.sections.setdefault("ub_overflow_recovered", [])[:0] = split
        return mod

    def _groups_to_split(self, forbidden) -> list:
        """(report record, forbidden entry) for each kernel of several ops of the cost-based grouping (not
        already forbidden) whose rule's schedule exceeded on-chip capacity and that thereby ended on the
        fallback rule or unscheduled: its parts alone may each get a rule that tiles them."""
        sections = self.report.sections
        rows = {r["name"]: r for r in sections.get("grouping", {}).get("groups", [])}
        kernels = {k["name"]: k for k in self.report.kernels}
        out = []
        for record in sections.get("ub_overflow_recovered", []):
            if record.get("action") != "next_rule" or record.get("final_rule") not in GENERIC_RULES:
                continue
            row = kernels.get(record["kernel"], {})
            group = rows.get(row.get("source_name", record.get("source_kernel", record["kernel"])))
            if group is None or len(group.get("members", [])) < 2:
                continue            # one op, or a pattern group nothing joined: nothing to split
            entry = (group["block"], tuple(group["members"]), record["needed_bytes"], record["available_bytes"])
            if any(e[:2] == entry[:2] for e in forbidden):
                continue
            split = {k: v for k, v in record.items() if k != "final_rule"}
            split.update(action="split_group", ops=group.get("ops"), instead_of_rule=record.get("final_rule"))
            out.append((split, entry))
        return out


def ascendfuse_pipeline(target=None, switches=None, report=None, traffic_baseline=False,
                        rules=None, precision_mode=None) -> AscendFusePipeline:
    return AscendFusePipeline(target, switches, report, traffic_baseline, rules, precision_mode)


if "ascendfuse" not in relax.pipeline.PIPELINE_MAP:
    relax.register_pipeline("ascendfuse")(ascendfuse_pipeline)
