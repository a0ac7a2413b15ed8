"""Helpers for the graph-fusion tests: run one pass, compare numbers, list ops, build ONNX models."""

from __future__ import annotations

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from tests.helpers import assert_close, random_inputs, run_reference, tol
from tvm_ascendfuse.report import SWITCHED_OFF, FusionReport


def run_pass(cls, mod, enabled=True):
    """``(module after the pass, its PassRecord)``."""
    report = FusionReport()
    out = cls(report=report, enabled=enabled)(mod)
    return out, report.get(cls.switch_name)


def ops(mod, func="main") -> list[str]:
    """Names of the Relax ops called in ``func``, in binding order (without the ``relax.`` prefix)."""
    names = []
    for block in mod[func].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op):
                names.append(b.value.op.name.replace("relax.", ""))
    return names


def assert_same_after(before, after, seed=0, inputs=None):
    """Both modules compiled with TVM's default pipeline give the same numbers on random inputs."""
    inputs = random_inputs(before, seed) if inputs is None else inputs
    ref, out = run_reference(before, inputs), run_reference(after, inputs)
    pairs = zip(out, ref) if isinstance(ref, list) else [(out, ref)]
    for a, b in pairs:
        assert_close(a, b, **tol(str(before["main"].params[0].ty.dtype)))
    return out, inputs


def assert_switched_off(cls, mod, matches: int):
    """Switched off: the matches are recorded with reason switched_off and the module is unchanged."""
    out, rec = run_pass(cls, mod, enabled=False)
    assert rec.match_times == matches and rec.effect_times == 0
    assert [e["reason"] for e in rec.not_effective] == [SWITCHED_OFF] * matches
    tvm.ir.assert_structural_equal(out, mod)


def assert_refused(cls, mod, failed_substring: str):
    """One match, refused with a check_failed reason mentioning ``failed_substring``; module unchanged."""
    out, rec = run_pass(cls, mod)
    assert rec.match_times == 1 and rec.effect_times == 0, rec.to_dict()
    assert rec.not_effective[0]["reason"] == "check_failed"
    assert failed_substring in rec.not_effective[0]["failed"], rec.not_effective
    tvm.ir.assert_structural_equal(out, mod)


# ---- ONNX -----------------------------------------------------------------------------------------------
def onnx_model(nodes, inputs: dict, outputs: dict, inits: dict, opset=13) -> onnx.ModelProto:
    """``inputs``/``outputs``: name -> shape (float32); ``inits``: name -> numpy array."""
    vi = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
    graph = helper.make_graph(nodes, "g", [vi(n, s) for n, s in inputs.items()],
                              [vi(n, s) for n, s in outputs.items()],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9   # onnxruntime rejects the newest IR versions
    return model


def run_ort(model: onnx.ModelProto, inputs: list[np.ndarray]):
    import onnxruntime as ort

    from tvm_ascendfuse.verify import exact_integer_ops, reference_session_options

    sess = ort.InferenceSession(exact_integer_ops(model).SerializeToString(), reference_session_options(threads=1),
                                providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, dict(zip(names, inputs)))[0]


def build(body, *shapes, dtype="float32"):
    """``main(x0, x1, ...)`` whose dataflow block is ``body(bb, *params) -> output`` (a Relax expr or tuple)."""
    params = [relax.Var(f"x{i}", relax.TensorType(s, dtype)) for i, s in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = body(bb, *params)
            if isinstance(out, (list, tuple)):
                out = relax.Tuple(list(out))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()
