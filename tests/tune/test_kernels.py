"""The kernels a run tunes: one per distinct function (its launches counted), the tunable ones decided by
the rules themselves (``ScheduleRule.tunable``), symbolic shapes left out with the reason."""

import pytest
import tvm
from tvm import relax, tirx

from tests.tune.models import NO_CHAIN, mlp
from tvm_ascendfuse.errors import AscendFuseError
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.schedule.apply import DEFAULT_RULES
from tvm_ascendfuse.schedule.conv import Conv2dRule
from tvm_ascendfuse.schedule.matmul import MatmulRule
from tvm_ascendfuse.schedule.tunable import tunable_rules
from tvm_ascendfuse.target import get_target
from tvm_ascendfuse.tune import extract_kernels, select_kernels

NPU = get_target("ascend910b")
HOST = NPU.host_target(portable=True)


def test_equal_layers_are_one_kernel_launched_several_times():
    mod = import_onnx(mlp([32, 32, 32, 32, 8]))
    kernels = extract_kernels(mod, NPU, HOST, NO_CHAIN)
    assert [(k.rule, k.calls, k.tunable) for k in kernels] == [("matmul", 3, True), ("matmul", 1, True)]
    assert all(isinstance(k.default["main"], tirx.PrimFunc) for k in kernels)
    again = extract_kernels(import_onnx(mlp([32, 32, 32, 32, 8], seed=1)), NPU, HOST, NO_CHAIN)
    assert [k.key for k in again] == [k.key for k in kernels]      # other weights, same kernels, same ids


def test_copies_of_one_function_under_two_names_are_one_kernel():
    """FuseTIR merges equal fused functions itself; two names for one function that differ only in
    bookkeeping attributes (which the database key leaves out) are merged here, their launches added."""
    import numpy as np
    from tvm import te, topi

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 32), "float32"))
    a, b = te.placeholder((16, 32), name="A"), te.placeholder((32, 32), name="B")
    func = te.create_prim_func([a, b, topi.nn.matmul(a, b)])
    gv_a = bb.add_func(func.with_attr("global_symbol", "mm_a"), "mm_a")
    gv_b = bb.add_func(func.with_attr("global_symbol", "mm_b").with_attr("ascendfuse.note", "copy"), "mm_b")
    out_type = relax.TensorType((16, 32), "float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.call_tir(gv_a, [x, relax.const(np.ones((32, 32), "float32"))], out_type))
            y = bb.emit(relax.call_tir(gv_b, [h, relax.const(np.full((32, 32), 2, "float32"))], out_type))
            bb.emit_output(y)
        bb.emit_func_output(y)
    mod = bb.get()
    assert {"mm_a", "mm_b"} <= {gv.name_hint for gv in mod.functions}
    (kernel,) = extract_kernels(mod, NPU, HOST, NO_CHAIN)
    assert kernel.rule == "matmul" and kernel.calls == 2


def test_the_rules_say_which_are_tunable(monkeypatch):
    assert {"matmul": MatmulRule, "conv2d": Conv2dRule}.items() <= tunable_rules().items()
    assert set(tunable_rules().values()) == {r for r in DEFAULT_RULES if r.tunable}
    mod = import_onnx(mlp([32, 48]))
    assert [k.tunable for k in extract_kernels(mod, NPU, HOST)] == [True]
    monkeypatch.setattr(MatmulRule, "tunable", False)             # a rule that stops declaring it
    (kernel,) = extract_kernels(mod, NPU, HOST)
    assert kernel.rule == "matmul" and not kernel.tunable
    with pytest.raises(AscendFuseError, match="no kernel of this model uses a tunable rule"):
        select_kernels([kernel], None)
    with pytest.raises(AscendFuseError, match="rule 'matmul', which has no tunable space"):
        select_kernels([kernel], [kernel.name])


def test_a_kernel_of_symbolic_shape_is_not_tunable():
    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 32), "float32"))
    w = relax.const(tvm.runtime.tensor(__import__("numpy").ones((32, 48), "float32")))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.matmul(x, w)))
        bb.emit_func_output(out)
    kernels = extract_kernels(bb.get(), NPU, HOST)
    (k,) = [k for k in kernels if k.rule == "matmul"]
    assert not k.static and not k.tunable
    with pytest.raises(AscendFuseError, match="symbolic shapes"):
        select_kernels(kernels, [k.name])
