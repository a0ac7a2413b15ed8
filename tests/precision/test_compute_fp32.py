"""Float32ComputePass: a 16-bit model computed in float32, its signature unchanged."""

import numpy as np
import tvm
from tvm import relax

from tvm_ascendfuse.precision import Float32ComputePass, PrecisionPlan
from tvm_ascendfuse.report import FusionReport


def _fp16_model(dtype="float16"):
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((16, 16)).astype("float32")).value.numpy()
            h = relax.op.matmul(x, relax.const(w.astype(dtype) if dtype == "float16" else w, dtype),
                                out_dtype=dtype)
            h = relax.op.astype(relax.op.nn.softmax(relax.op.astype(h, "float32")), dtype)
            out = bb.emit_output(relax.op.nn.relu(h))
        bb.emit_func_output(out)
    return bb.get()


def _dtypes(func):
    found = set()
    relax.analysis.post_order_visit(func.body, lambda e: found.add(str(e.ty.dtype)) if isinstance(
        e, (relax.Var, relax.Call)) and isinstance(getattr(e, "ty", None), relax.TensorType) else None)
    return found


def test_fp16_model_computed_in_float32():
    mod = _fp16_model()
    plan, report = PrecisionPlan(), FusionReport()
    out = Float32ComputePass(report, plan)(mod)
    func = out["main"]
    # the signature is the model's; inside, only the entry and exit conversions are 16-bit
    assert str(func.params[0].ty.dtype) == "float16" and str(func.body.body.ty.dtype) == "float16"
    bindings = [b for block in func.body.blocks for b in block.bindings]
    sixteen = [b for b in bindings if str(b.var.ty.dtype) == "float16"]
    assert len(sixteen) == 1 and sixteen[0].value.op.name == "relax.astype"
    assert plan.model_dtypes == {"float16"} and plan.storage_dtype == "float16"
    assert report.get("Float32Compute").effect_times == 1
    # same numbers as the float32 computation of the fp16 values
    x = np.random.default_rng(1).standard_normal((8, 16)).astype("float16")
    ex = tvm.compile(out, target="llvm")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    w = mod["main"].body.blocks[0].bindings[0].value.args[1].value.numpy().astype("float32")
    s = x.astype("float32") @ w
    e = np.exp(s - s.max(-1, keepdims=True))
    want = np.maximum(e / e.sum(-1, keepdims=True), 0).astype("float16")
    np.testing.assert_allclose(got.astype("float32"), want.astype("float32"), rtol=0, atol=1e-3)


def test_float32_model_untouched():
    mod = _fp16_model("float32")
    plan = PrecisionPlan()
    out = Float32ComputePass(FusionReport(), plan)(mod)
    assert out.same_as(mod) and plan.model_dtypes == set() and plan.storage_dtype is None


def test_sixteen_bit_call_tir_keeps_the_rest_in_float32():
    """The importer's reflect Pad is a call_tir typed fp16 (emit_te): that call stays fp16 (operands rounded
    back to fp16, which the model's tensor is there), the conv after it accumulates in float32. Refusing the
    function instead left the conv accumulating 576 products in fp16, many rounding steps off."""
    from onnx import TensorProto, helper, numpy_helper

    from tests.helpers import compile_ours, run_vm
    from tvm_ascendfuse.frontend import import_onnx

    rng = np.random.default_rng(0)
    ic, oc, hw = 64, 32, 12
    w = (rng.standard_normal((oc, ic, 3, 3)) * 0.3).astype(np.float16)
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")]
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"), helper.make_node("Conv", ["p", "w"], ["y"]),
         helper.make_node("Relu", ["y"], ["z"])], "pad_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, ic, hw, hw])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT16, [1, oc, hw, hw])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    mod = import_onnx(model)
    assert any(b.value.op.name == "relax.call_tir" for b in mod["main"].body.blocks[0].bindings)
    result = compile_ours(mod)
    assert result.report.to_dict()["other"]["Float32Compute"]["effect_times"] == 1
    x = rng.uniform(0, 1, (1, ic, hw, hw)).astype(np.float16)
    got = run_vm(result.executable, [x]).astype(np.float32)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)), mode="reflect")
    acc = np.zeros((1, oc, hw, hw))
    for kh in range(3):
        for kw in range(3):
            acc += np.einsum("oc,nchw->nohw", w[:, :, kh, kw].astype(np.float64), xp[:, :, kh:kh + hw, kw:kw + hw])
    want = np.maximum(acc, 0).astype(np.float16).astype(np.float32)
    ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float32)
    assert np.all(np.abs(got - want) <= ulp)


def test_call_typed_for_its_16_bit_operand_gets_it_back():
    """A call_tir whose PrimFunc reads fp16 and writes float32 (topi promoting an fp16 tensor with a Python
    float): its widened operand is rounded back to fp16 for it, not handed over as float32."""
    from tvm import topi

    from tests.helpers import compile_ours, run_vm

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 32), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(x))
            y = bb.emit_te(lambda a: topi.add(a, 0.5), h)
            out = bb.emit_output(relax.op.multiply(y, relax.const(2.0, "float32")))
        bb.emit_func_output(out)
    mod = bb.get()
    assert str(mod["main"].body.body.ty.dtype) == "float32"
    result = compile_ours(mod)
    assert result.report.to_dict()["other"]["Float32Compute"]["effect_times"] == 1
    xv = np.random.default_rng(0).standard_normal((4, 32)).astype("float16")
    got = run_vm(result.executable, [xv])
    want = (np.maximum(xv, 0).astype("float32") + 0.5) * 2
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
