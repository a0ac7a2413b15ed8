"""Run the grouping pass alone on a legalized module and compare with the unfused module."""

from __future__ import annotations

import tvm
from tvm import relax

from tests.helpers import assert_close, random_inputs, run_vm, tol
from tvm_ascendfuse.analysis.kernels import launch_count
from tvm_ascendfuse.grouping import CostBasedFusionPass
from tvm_ascendfuse.report import FusionReport


def build(shapes, body):
    """A ``main`` over float32 inputs of ``shapes`` whose output is ``body(bb, *inputs)``."""
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *xs))
        bb.emit_func_output(out)
    return bb.get()


def legalize(mod: tvm.IRModule) -> tvm.IRModule:
    """What the grouping pass sees in the pipeline: call_tirs annotated with their op pattern."""
    return tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(), relax.transform.DeadCodeElimination()])(mod)


def group(mod: tvm.IRModule, target="ascend910b", config=None, report=None):
    """-> (module after grouping + FuseTIR, report)."""
    report = report if report is not None else FusionReport()
    grouped = CostBasedFusionPass(target, report, config)(legalize(mod))
    fused = relax.transform.DeadCodeElimination()(relax.transform.FuseTIR()(grouped))
    return fused, report, grouped


def _run(mod, inputs):
    out = run_vm(tvm.compile(mod, target="llvm"), inputs)
    return out if isinstance(out, list) else [out]


def check_equivalent(mod: tvm.IRModule, seed: int = 0, target="ascend910b", config=None):
    """Grouped+fused vs legalized-unfused on random inputs; returns (fused, report, launches before, after)."""
    inputs = random_inputs(mod, seed)
    base = legalize(mod)
    fused, report, _ = group(mod, target, config)
    for a, b in zip(_run(fused, inputs), _run(base, inputs)):
        assert_close(a, b, **tol("float32"))
    return fused, report, launch_count(base), launch_count(fused)
