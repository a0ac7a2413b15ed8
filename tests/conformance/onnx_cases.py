"""ONNX backend node conformance cases for the fusion-relevant ops, generated in-process (no downloads).

The ``onnx`` package ships a generator per op (``onnx.backend.test.case.node.<module>``); importing a module
runs its ``export*`` functions, each seeded with ``np.random.seed(0)`` by onnx itself, and appends
``TestCase``s (model + inputs + expected outputs) to a module-level list. Importing only the modules we need
keeps generation to a few seconds instead of ~40 s for the whole catalogue.

``run_case(case, compile_fn)`` imports the model with TVM's ONNX frontend, compiles it with ``compile_fn``
and compares with the case's expected outputs (ONNX's own tolerance: rtol 1e-3, atol 1e-7; looser for fp16).
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass

import numpy as np

# op family -> onnx generator module names (file names under onnx/backend/test/case/node/)
OP_MODULES = {
    "conv": ["conv"],
    "batchnorm": ["batch_normalization"],
    "gemm": ["gemm", "matmul"],
    "norm": ["layernormalization", "groupnormalization", "instance_normalization", "rmsnormalization"],
    "softmax": ["softmax", "logsoftmax"],
    "activation": ["relu", "sigmoid", "tanh", "leakyrelu", "hardsigmoid", "hardswish", "elu", "selu", "gelu",
                   "erf", "clip", "prelu", "softplus", "swish", "mish", "celu", "softsign"],
    "elementwise": ["add", "sub", "mul", "div", "pow", "sqrt", "exp", "log", "abs", "neg", "reciprocal", "max",
                    "min", "sum", "mean", "floor", "ceil", "sign", "where"],
    "reduction": ["reducemean", "reducesum", "reducemax", "reducemin", "reduceprod", "reducel1", "reducel2",
                  "reducesumsquare", "reduce_log_sum", "reduce_log_sum_exp"],
    "layout": ["concat", "slice", "reshape", "transpose", "flatten", "squeeze", "unsqueeze", "split", "expand"],
    "pooling": ["maxpool", "averagepool", "globalaveragepool", "globalmaxpool"],
}

# ONNX's backend-test tolerance, widened for half precision (the case data is computed in fp32/fp64 numpy).
RTOL, ATOL = 1e-3, 1e-7
HALF_TOL = {"float16": (1e-2, 1e-3), "bfloat16": (2e-2, 1e-2)}


@dataclass
class Outcome:
    status: str          # "pass", "import_error", "compile_error", "run_error", "mismatch"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "pass"


_CACHE: dict[str, list] = {}


def load_cases(families=None) -> list:
    """All node cases (incl. ``*_expanded`` function bodies) of the listed families, in a stable order."""
    from onnx.backend.test.case import node as onnx_node

    families = list(OP_MODULES) if families is None else list(families)
    out = []
    for fam in families:
        for modname in OP_MODULES[fam]:
            if modname not in _CACHE:
                start = len(onnx_node._NodeTestCases)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        importlib.import_module(f"onnx.backend.test.case.node.{modname}")
                    except ModuleNotFoundError:
                        _CACHE[modname] = []
                        continue
                _CACHE[modname] = list(onnx_node._NodeTestCases[start:])
            out += [(fam, c) for c in _CACHE[modname]]
    return out


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    # TVM FFI errors put the message last; keep it short for listing.
    msg = lines[-1] if lines else ""
    return f"{type(err).__name__}: {msg}"[:300]


def import_case(case, model=None):
    from tvm.relax.frontend.onnx import from_onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_onnx(case.model if model is None else model)


def freeze_int_inputs(case):
    """(model, remaining inputs) with every integer graph input (axes, shapes, starts/ends, ...) turned into an
    initializer holding the case's value: what an exporter emits, and what TVM's importer needs (it rejects
    runtime axes). None when the case has no integer input."""
    import onnx
    from onnx import numpy_helper

    inputs = list(case.data_sets[0][0])
    names = [vi.name for vi in case.model.graph.input]
    keep, frozen = [], []
    for name, arr in zip(names, inputs):
        arr = np.asarray(arr)
        (frozen if arr.dtype.kind in "iu" else keep).append((name, arr))
    if not frozen:
        return None
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    kept = {n for n, _ in keep}
    graph_inputs = [vi for vi in model.graph.input if vi.name in kept]
    del model.graph.input[:]
    model.graph.input.extend(graph_inputs)
    model.graph.initializer.extend(numpy_helper.from_array(arr, name) for name, arr in frozen)
    return model, [a for _, a in keep]


def _to_tvm(a):
    import tvm

    return tvm.runtime.tensor(np.ascontiguousarray(a))


def _flatten(res):
    if hasattr(res, "numpy"):
        return [res.numpy()]
    out = []
    for r in res:
        out += _flatten(r)
    return out


def compare(got: list, expected: list) -> str:
    """'' when ``got`` matches ``expected`` within the ONNX backend tolerance, else what differs."""
    if len(got) < len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        e = np.asarray(e)
        if g.shape != e.shape:
            return f"output {i}: shape {g.shape} != expected {e.shape}"
        if e.dtype.kind in "biu":
            if not np.array_equal(g, e):
                return f"output {i}: integer values differ"
            continue
        rtol, atol = HALF_TOL.get(str(e.dtype), (RTOL, ATOL))
        try:
            np.testing.assert_allclose(g.astype("float64"), e.astype("float64"), rtol=rtol, atol=atol)
        except AssertionError as err:
            lines = [ln for ln in str(err).splitlines() if "Max absolute" in ln or "Mismatched" in ln]
            return f"output {i}: " + "; ".join(ln.strip() for ln in lines)
    return ""


def run_case(case, compile_fn, mod=None, inputs=None) -> Outcome:
    """Import (unless ``mod`` is given), compile with ``compile_fn(mod) -> executable``, run, compare."""
    from tvm import relax
    import tvm

    if mod is None:
        try:
            mod = import_case(case)
        except Exception as err:  # the frontend raises many types; listed, not blamed on the pipeline
            return Outcome("import_error", _first_line(err))
    try:
        ex = compile_fn(mod)
    except Exception as err:
        return Outcome("compile_error", _first_line(err))
    if inputs is None:
        inputs = case.data_sets[0][0]
    expected = case.data_sets[0][1]
    try:
        vm = relax.VirtualMachine(ex, tvm.cpu())
        got = _flatten(vm["main"](*[_to_tvm(a) for a in inputs]))
    except Exception as err:
        return Outcome("run_error", _first_line(err))
    diff = compare(got, list(expected))
    return Outcome("mismatch", diff) if diff else Outcome("pass")


def compile_default(mod):
    """TVM's default CPU pipeline (FuseOps+FuseTIR), the reference build."""
    import tvm
    from tvm import relax

    target = tvm.target.Target("llvm")
    return tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))


def compile_ascendfuse(mod):
    import tvm_ascendfuse as af

    return af.compile_model(mod, portable=True).executable
