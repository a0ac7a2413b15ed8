"""The distinct kernels of a model as the schedule phase sees them, with their launches per run.

The model goes through the pipeline up to the schedule phase, so each kernel is keyed exactly as the
schedule phase will look it up (``schedule.tuned.workload_module``). Kernels that are the same function
(e.g. the repeated blocks of a ResNet stage) are one kernel launched several times: tuned once, and their
launches count toward its share of the model's run time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax, tirx

from ..errors import AscendFuseError
from ..target import AscendTarget, get_target


@dataclass(eq=False)
class Kernel:
    """One distinct kernel of the model as the schedule phase sees it."""

    name: str                  # the kernel's name after UB fusion (``source_name`` in the compile report)
    scheduled_name: str        # its name in the schedule phase (after TVM's layout-free marking)
    workload: tvm.IRModule     # the database key: tuned.workload_module of the prepared kernel
    rule: str | None           # the rule the schedule phase picks without records
    tunable: bool              # its rule has a tunable space and its shapes are static
    key: str = ""              # stable id of the workload (work-dir folder name)
    calls: int = 1             # launches per run of the model (every function equal to this one)
    default: tvm.IRModule | None = None   # the untuned schedule (the rule's; the kernel as is without one)
    static: bool = True        # every parameter has a constant shape (MetaSchedule can only measure those)
    found: tvm.IRModule | None = None   # the kernel before its rule's ``prepare`` (None: the workload itself)

    def __post_init__(self):
        if self.found is None:
            self.found = self.workload

    def why_not_tunable(self) -> str:
        if not self.static:
            return "it has symbolic shapes (only kernels of constant shape can be measured)"
        return f"it is scheduled by rule '{self.rule or 'none'}', which has no tunable space"


def workload_key(workload: tvm.IRModule) -> str:
    """Hex id of a workload's structure, the same in every process (names are not part of it)."""
    return f"{tvm_ffi.structural_hash(workload) & 0xFFFFFFFFFFFFFFFF:016x}"


def _static(func: tirx.PrimFunc) -> bool:
    return all(isinstance(p.ty, tirx.BufferType) and all(isinstance(d, tirx.IntImm) for d in p.ty.shape)
               for p in func.params)


def extract_kernels(mod: tvm.IRModule, target: AscendTarget | str, host, switches=None) -> list[Kernel]:
    """Distinct kernels of ``mod`` after UB fusion, keyed and ruled as the schedule phase would."""
    from ..analysis import launched_kernels
    from ..analysis.ub_usage import normalize_scope_aliases
    from ..pipeline import AscendFusePipeline
    from ..schedule.apply import DEFAULT_RULES, ApplyUBSchedules
    from ..schedule.fast_math import use_fast_math
    from ..schedule.tunable import tunable_rules
    from ..schedule.tuned import workload_module

    npu = get_target(target)
    pipeline = AscendFusePipeline(npu, switches)
    with host:
        npu, resolved, tvm_target = pipeline.resolve()
        for phase, passes in pipeline.phases(npu, resolved, tvm_target):
            if phase == "schedule":
                break
            mod = tvm.transform.Sequential(passes)(mod)
        before = launched_kernels(mod)
        mod = relax.transform.AttachAttrLayoutFreeBuffers()(mod)
        after = launched_kernels(mod)
    source = dict(zip(after, before)) if len(after) == len(before) else {}
    launches = Counter(after)
    untuned = ApplyUBSchedules(npu, rules=DEFAULT_RULES)
    tunable = tunable_rules()
    kernels: list[Kernel] = []
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc) or (func.attrs is not None and "tirx.is_scheduled" in func.attrs):
            continue
        workload = workload_module(use_fast_math(normalize_scope_aliases(func)))
        same = next((k for k in kernels if tvm_ffi.structural_equal(workload, k.found)), None)
        if same is not None:
            same.calls += launches.get(gv.name_hint, 0)
            continue
        scheduled, rule = untuned.schedule_one(gv.name_hint, func, host)[:2]
        static = _static(workload["main"])
        key = workload
        prepare = getattr(tunable.get(rule), "prepare", None)
        if prepare is not None:
            workload = workload_module(prepare(workload["main"]))   # what the rule schedules (base.py)
        kernels.append(Kernel(source.get(gv.name_hint, gv.name_hint), gv.name_hint, workload, rule,
                              rule in tunable and static, workload_key(workload), launches.get(gv.name_hint, 0),
                              workload_module(scheduled) if rule is not None else workload, static, key))
    return kernels


def select_kernels(kernels: list[Kernel], names: list[str] | None) -> list[Kernel]:
    """The tunable kernels, or the named ones (each must exist and be tunable)."""
    tunable = [k for k in kernels if k.tunable]
    if not names:
        if not tunable:
            rules = ", ".join(sorted({k.rule or "unscheduled" for k in kernels}))
            raise AscendFuseError(f"no kernel of this model uses a tunable rule (its kernels use: {rules})")
        return tunable
    by_name = {}
    for k in kernels:
        by_name[k.name] = by_name[k.scheduled_name] = k
    chosen = []
    for name in names:
        if name not in by_name:
            valid = ", ".join(k.name for k in tunable) or "none"
            raise AscendFuseError(f"unknown kernel '{name}'; tunable kernels of this model: {valid}")
        k = by_name[name]
        if not k.tunable:
            raise AscendFuseError(f"kernel '{name}' cannot be tuned: {k.why_not_tunable()}; tunable kernels: "
                                  f"{', '.join(t.name for t in tunable) or 'none'}")
        if k not in chosen:
            chosen.append(k)
    return chosen
