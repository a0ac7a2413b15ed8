"""Shared test utilities: build a module both ways and compare numbers."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

import tvm_ascendfuse as af

TOLERANCE = {"float32": (1e-4, 1e-4), "float16": (2e-2, 2e-2), "bfloat16": (5e-2, 5e-2), "float64": (1e-9, 1e-9)}


def tol(dtype: str) -> dict:
    rtol, atol = TOLERANCE.get(dtype, (0, 0))
    return {"rtol": rtol, "atol": atol}


def random_inputs(mod: tvm.IRModule, seed: int = 0, func: str = "main") -> list[np.ndarray]:
    """Random arrays for the tensor parameters of ``func`` (static shapes only)."""
    rng = np.random.default_rng(seed)
    out = []
    for p in mod[func].params:
        shape = [int(d) for d in p.ty.shape]
        dtype = str(p.ty.dtype)
        if dtype.startswith("int"):
            out.append(rng.integers(-8, 8, shape).astype(dtype))
        else:
            out.append((rng.standard_normal(shape)).astype(dtype))
    return out


def run_vm(executable, inputs, func: str = "main"):
    vm = relax.VirtualMachine(executable, tvm.cpu())
    res = vm[func](*[tvm.runtime.tensor(x) for x in inputs])
    if isinstance(res, (list, tuple)) or hasattr(res, "__len__") and not hasattr(res, "numpy"):
        return [r.numpy() for r in res]
    return res.numpy()


def run_reference(mod: tvm.IRModule, inputs, func: str = "main"):
    """TVM's default CPU pipeline: the unfused-by-us reference."""
    ex = tvm.compile(mod, target="llvm", relax_pipeline=relax.get_default_pipeline(tvm.target.Target("llvm")))
    return run_vm(ex, inputs, func)


def compile_ours(mod: tvm.IRModule, target="ascend910b", switches=None, portable=True, traffic_baseline=False):
    """Our pipeline; portable host code keeps tests independent of the machine's CPU."""
    return af.compile_model(mod, target=target, switches=switches, portable=portable,
                            traffic_baseline=traffic_baseline)


def assert_same_numbers(mod: tvm.IRModule, seed: int = 0, switches=None, target="ascend910b",
                        traffic_baseline=False):
    """Compile ``mod`` with our pipeline and TVM's default; outputs must agree within dtype tolerance.
    Returns the CompileResult so callers can check kernels and the report."""
    inputs = random_inputs(mod, seed)
    result = compile_ours(mod, target=target, switches=switches, traffic_baseline=traffic_baseline)
    ours, ref = run_vm(result.executable, inputs), run_reference(mod, inputs)
    dtype = str(mod["main"].params[0].ty.dtype)
    if isinstance(ref, list):
        for a, b in zip(ours, ref):
            np.testing.assert_allclose(a, b, **tol(dtype))
    else:
        np.testing.assert_allclose(ours, ref, **tol(dtype))
    return result


def kernel_count(result) -> int:
    return sum(k["launches"] for k in result.report.kernels)


def assert_scheduled_within_capacity(result, target="ascend910b", scopes=("local.UB", "local.L1", "local.L0C")):
    """Every scheduled kernel's on-chip bytes per scope, counted on its TIR, within the target's capacity."""
    from tvm_ascendfuse.analysis.ub_usage import kernel_usage

    npu = af.get_target(target)
    for gv, func in result.scheduled_module.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and func.attrs and "tirx.is_scheduled" in func.attrs:
            usage = kernel_usage(gv.name_hint, func, npu)
            for scope in scopes:
                assert usage.bytes(scope) <= npu.capacity(scope), (gv.name_hint, scope, usage.bytes(scope))
