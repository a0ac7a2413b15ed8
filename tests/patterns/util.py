"""Small graph builders and assertions shared by the pattern tests."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tests.helpers import assert_close, assert_same_numbers, run_reference, tol
from tvm_ascendfuse.patterns import pattern_table

SPECS = {s.name: s for s in pattern_table()}


def build(params, body, name="main"):
    """``params``: [(name, shape, dtype)]; ``body(bb, *vars)`` emits the bindings and returns the output."""
    bb = relax.BlockBuilder()
    vs = [relax.Var(n, relax.TensorType(s, d)) for n, s, d in params]
    with bb.function(name, vs):
        with bb.dataflow():
            out = body(bb, *vs)
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def const(shape, dtype="float32", seed=1):
    return relax.const(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def assert_one_kernel(result, pattern: str):
    """The whole graph became ONE kernel made by ``pattern`` (a 16-bit model's entry conversions included),
    and the report counts the effect."""
    kernels = result.report.kernels
    assert len(kernels) == 1 and kernels[0]["launches"] == 1, kernels
    assert kernels[0]["pattern"] == pattern, kernels
    rec = result.report.get(SPECS[pattern].switch)
    assert rec.effect_times >= 1, rec.to_dict()


def assert_fused(mod, pattern: str, **kw):
    """Numbers equal to TVM's default build, and the graph is one kernel from ``pattern``."""
    result = assert_same_numbers(mod, **kw)
    assert_one_kernel(result, pattern)
    return result


def refusals(result, switch: str) -> list[dict]:
    return result.report.get(switch).not_effective


def run_symbolic(mod, result, shapes, dtype="float32"):
    """Run a module with symbolic dims on concrete inputs, ours vs TVM default."""
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    vm = relax.VirtualMachine(result.executable, tvm.cpu())
    ours = vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()
    assert_close(ours, run_reference(mod, inputs), **tol(dtype))
