"""ONNX backend node conformance cases, generated in-process (no downloads).

The ``onnx`` package ships a generator per op (``onnx.backend.test.case.node.<module>``); importing a module
runs its ``export*`` functions, each seeded with ``np.random.seed(0)`` by onnx itself, and appends
``TestCase``s (model + inputs + expected outputs) to a module-level list. ``load_all_cases`` imports every
module (the whole suite, ~5 s) and names each case's op type; ``OP_MODULES`` labels the modules of the
fusion-relevant families for the tallies.

``run_case(case, compile_fn)`` imports the model with TVM's ONNX frontend, compiles it with ``compile_fn``
and compares with the case's expected outputs (ONNX's own tolerance: rtol 1e-3, atol 1e-7; looser for fp16).
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass

import numpy as np

# fusion-relevant family -> onnx generator module names (files under onnx/backend/test/case/node/); other
# modules are their own family
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


def _import_generator(modname: str) -> list:
    """The cases one onnx generator module appends when imported (cached: a module runs once a process)."""
    from onnx.backend.test.case import node as onnx_node

    if modname not in _CACHE:
        start = len(onnx_node._NodeTestCases)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                importlib.import_module(f"onnx.backend.test.case.node.{modname}")
            except ModuleNotFoundError:
                _CACHE[modname] = []
                return []
        _CACHE[modname] = list(onnx_node._NodeTestCases[start:])
    return _CACHE[modname]


def generator_modules() -> list[str]:
    """Every generator module of onnx's node suite (``ai_onnx_ml`` sub-modules included), sorted."""
    import pkgutil

    from onnx.backend.test.case import node as onnx_node

    prefix = onnx_node.__name__ + "."
    names = [m.name[len(prefix):] for m in pkgutil.walk_packages(onnx_node.__path__, prefix) if not m.ispkg]
    return sorted(n for n in names if not n.rsplit(".", 1)[-1].startswith("_"))


def family_of(modname: str) -> str:
    """The fusion-relevant family a generator module belongs to, else the module's own name."""
    return next((fam for fam, mods in OP_MODULES.items() if modname in mods), modname)


@dataclass(frozen=True)
class SuiteCase:
    module: str          # onnx generator module (file under onnx/backend/test/case/node/)
    op_type: str         # the ONNX op the case tests (for ``*_expanded``: the op whose body it runs)
    case: object         # onnx.backend.test.case.TestCase

    @property
    def name(self) -> str:
        return self.case.name

    @property
    def family(self) -> str:
        return family_of(self.module)


def load_all_cases() -> list[SuiteCase]:
    """The whole ONNX backend node suite (1884 cases in onnx 1.23), module by module, in a stable order.

    A case's op type is its node's; an ``*_expanded`` case (the op's function body, many nodes) takes the op
    type of the case it expands, else the single op its module tests."""
    out = []
    for modname in generator_modules():
        cases = _import_generator(modname)
        plain = {c.name: c.model.graph.node[0].op_type for c in cases
                 if "_expanded" not in c.name and len(c.model.graph.node) == 1}
        module_ops = sorted(set(plain.values()))
        for c in cases:
            op = plain.get(c.name)
            if op is None:
                base = c.name.split("_expanded")[0]
                op = plain.get(base) or (module_ops[0] if len(module_ops) == 1 else modname)
            out.append(SuiteCase(modname, op, c))
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
        # sequences, optionals and maps (lists, None) are runtime values the importer does not take either way
        is_int = isinstance(arr, np.ndarray) and arr.dtype.kind in "iu"
        (frozen if is_int else keep).append((name, arr))
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

    # np.ascontiguousarray would turn a 0-d input (Range's start, Clip's min) into shape (1,)
    a = np.asarray(a)
    return tvm.runtime.tensor(a if a.flags.c_contiguous else a.copy())


def _flatten(res):
    if hasattr(res, "numpy"):
        return [res.numpy()]
    out = []
    for r in res:
        out += _flatten(r)
    return out


def _flatten_expected(values) -> list:
    """Expected outputs with sequence outputs (lists of arrays) spread out, as the VM returns them (tuples)."""
    out = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out += _flatten_expected(v)
        else:
            out.append(v)
    return out


def compare(got: list, expected: list) -> str:
    """'' when ``got`` matches ``expected`` within the ONNX backend tolerance, else what differs."""
    expected = _flatten_expected(expected)
    if len(got) < len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        if e is None or not hasattr(np.asarray(e), "dtype") or np.asarray(e).dtype == object:
            return f"output {i}: expected value of type {type(e).__name__} is not a tensor"
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
