"""Fused PrimFuncs for rule tests, built the way the pipeline builds them (Primitive group -> LegalizeOps ->
FuseTIR), and a check that a rule's schedule computes what the unscheduled kernel computes."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx

from tests.helpers import assert_close, tol
from tvm_ascendfuse.target import get_target

# Portable x86-64 (4 fp32 lanes) keeps tests independent of this machine; ``NATIVE`` runs at the machine's own
# width (AVX2 or AVX-512): an assertion about a schedule's shape on NATIVE follows ``host_vector(NATIVE)``, one
# about a given width is made on an explicit host of that width (scheduled, not run).
HOST = tvm.target.Target({"kind": "llvm", "num-cores": 2})
NATIVE = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
NPU = get_target("ascend910b")


def fused_kernel(build, shapes, dtype="float32", name="fused_group") -> tirx.PrimFunc:
    """One PrimFunc computing ``build(*params)``; shapes may hold ``tirx.Var`` for symbolic dims."""
    bb = relax.BlockBuilder()
    ps = [relax.Var(f"p{i}", relax.TensorType(s, dtype)) for i, s in enumerate(shapes)]
    vs = [relax.Var(f"x{i}", relax.TensorType(s, dtype)) for i, s in enumerate(shapes)]
    with bb.function(name, ps, attrs={"Primitive": True}, private=True):
        with bb.dataflow():
            out = bb.emit_output(build(*ps))
        bb.emit_func_output(out)
    gv = bb.get().get_global_var(name)
    with bb.function("main", vs):
        with bb.dataflow():
            out = bb.emit_output(relax.Call(gv, vs))
        bb.emit_func_output(out)
    mod = relax.transform.FuseTIR()(relax.transform.LegalizeOps()(bb.get()))
    funcs = [f for _, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
    assert len(funcs) == 1, "the group must become one kernel"
    return funcs[0].with_attr("global_symbol", "main")


def attention_kernel(b=1, h=2, s=32, d=16, mask="full", dtype="float32", sq=None) -> tirx.PrimFunc:
    """softmax(Q·Kᵀ·scale (+ mask))·V with the K transpose inside the group (the attention pattern's form).
    ``mask``: None or a 4th parameter of shape [1, 1, sq, s] (pass ``causal_mask`` values as LLaMA does)."""
    from tvm.relax import op

    sq = sq or s
    shapes = [(b, h, sq, d), (b, h, s, d), (b, h, s, d)] + ([(1, 1, sq, s)] if mask else [])

    def build(q, k, v, *m):
        sc = op.multiply(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])),
                         relax.const(np.array(1 / np.sqrt(d), dtype)))
        if m:
            sc = op.add(sc, m[0])
        return op.matmul(op.nn.softmax(sc, -1), v)

    return fused_kernel(build, shapes, dtype, "fused_attention")


def causal_mask(sq, s, dtype="float32"):
    """Additive causal mask: the dtype's most negative value above the diagonal (as LLaMA exports)."""
    return np.triu(np.full((sq, s), np.finfo(dtype).min, dtype), 1 + s - sq).reshape(1, 1, sq, s)


def _concrete(shape, sizes):
    return [int(sizes.get(d.name, 0)) if isinstance(d, tirx.Var) else int(d) for d in shape]


def check_rule(rule, func: tirx.PrimFunc, host=HOST, sizes=None, seed=0, target=NPU, expect=True, fixed=None,
               with_note=False):
    """Schedule ``func`` with ``rule``; its outputs must match TVM's default build of the unscheduled kernel.
    ``sizes`` binds symbolic dims by name; ``fixed`` gives some inputs ({param index: array}).
    Returns the scheduled module (with ``with_note``: the module and the rule's note)."""
    from tvm_ascendfuse.schedule.fast_math import use_fast_math

    result = rule.apply_with_note(use_fast_math(func), target, host)
    if not expect:
        assert result is None, f"{rule.name} should decline this kernel"
        return None
    assert result is not None, f"{rule.name} declined the kernel"
    sch = result.sch
    rng = np.random.default_rng(seed)
    sizes = sizes or {}
    arrays = []
    for p in func.params:
        shape = _concrete(p.ty.shape, sizes)
        dtype = str(p.ty.dtype)
        arrays.append(rng.standard_normal(shape).astype(dtype) if dtype.startswith("float")
                      else rng.integers(0, max(1, min(shape or [1])), shape).astype(dtype))
    for idx, value in (fixed or {}).items():
        arrays[idx] = value
    ref = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    ours = tvm.compile(sch.mod, target=host)
    a = [tvm.runtime.tensor(x) for x in arrays]
    b = [tvm.runtime.tensor(x.copy()) for x in arrays]
    ref["main"](*a)
    ours["main"](*b)
    dtype = str(func.params[-1].ty.dtype)
    for x, y in zip(a, b):      # inputs stay equal; every output must match
        assert_close(y.numpy().astype("float64"), x.numpy().astype("float64"), **tol(dtype))
    return (sch.mod, result.note) if with_note else sch.mod


@tvm.transform.module_pass(opt_level=0, name="ScheduleGemmsForTest")
def schedule_gemms(mod, _ctx):
    """The Matmul rule on every PrimFunc it accepts (NATIVE host), as the schedule phase would."""
    from tvm_ascendfuse.schedule.matmul import MatmulRule

    for gv, func in list(mod.functions.items()):
        if isinstance(func, tirx.PrimFunc):
            sch = MatmulRule().apply(func, NPU, NATIVE)
            if sch is not None:
                mod[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    return mod


def assert_decision_replays(workload, rule: str, host) -> None:
    """A tunable rule's tile choice is one sampled decision in the trace: the trace replays to the same
    schedule; the least-drawn chooser gives the rule's default to the first two draws
    and two other candidates to the next two."""
    from tvm import s_tir
    import tvm_ffi

    from tvm_ascendfuse.schedule.tunable import LeastDrawnTiles, apply_tunable, candidate_schedules

    points = candidate_schedules(workload, rule, NPU, host)
    chooser = LeastDrawnTiles()
    chooser.allowed = {c for c, _ in points}
    drawn = []
    for seed in range(4):
        sch = s_tir.Schedule(workload, seed=seed + 1)
        apply_tunable(sch, rule, NPU, host, chooser)
        drawn.append(chooser.last)
        decisions = [d for inst, d in sch.trace.decisions.items() if inst.kind.name == "SampleCategorical"]
        assert len(decisions) == 1 and chooser.candidates[int(decisions[0])] == chooser.last
        replay = s_tir.Schedule(workload)
        sch.trace.apply_to_schedule(replay, remove_postproc=False)
        assert tvm_ffi.structural_equal(replay.mod, sch.mod)
    assert drawn[:2] == [points[0][0]] * 2 and points[0][0] not in drawn[2:] and len(set(drawn[2:])) == 2

