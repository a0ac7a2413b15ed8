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


def assert_close(actual, desired, rtol: float = 1e-7, atol: float = 0.0, err_msg: str = "") -> None:
    """``np.testing.assert_allclose`` with ``atol`` a fraction of the reference's largest magnitude
    (``max |desired|``), never an absolute floor: an output of 1e-4 checked against an absolute 1e-4 would
    pass whatever a kernel wrote. Lists and tuples are compared element by element, each on its own scale."""
    if isinstance(desired, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(desired), \
            f"{len(actual) if isinstance(actual, (list, tuple)) else 'one'} outputs, expected {len(desired)}"
        for k, (a, d) in enumerate(zip(actual, desired)):
            assert_close(a, d, rtol, atol, f"{err_msg} (output {k})")
        return
    desired = np.asarray(desired)
    scale = 0.0
    if desired.dtype.kind in "fc":
        finite = np.abs(desired[np.isfinite(desired)])
        scale = float(finite.max(initial=0.0))
    elif desired.dtype.kind in "iu":
        scale = float(np.abs(desired.astype(np.float64)).max(initial=0.0))
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol * scale, err_msg=err_msg)


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
            assert_close(a, b, **tol(dtype))
    else:
        assert_close(ours, ref, **tol(dtype))
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


def round_to_bf16(a) -> np.ndarray:
    """float32 ``a`` rounded to bfloat16 (nearest, ties to even), returned as float32: the operands a bf16 dot
    product multiplies, for a reference computed in float32."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)
