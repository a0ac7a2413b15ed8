"""Precision modes: CANN's names, bf16 only where the target has it, errors that name the problem."""

import pytest
from tvm import relax

import tvm_ascendfuse as af
from tvm_ascendfuse.errors import PrecisionModeError
from tvm_ascendfuse.precision import MODES, PrecisionPlan, resolve_mode
from tvm_ascendfuse.target import get_target

CANN_MODES = ("force_fp32", "must_keep_origin_dtype", "allow_fp32_to_fp16", "force_fp16", "allow_mix_precision",
              "force_bf16", "allow_mix_precision_bf16")


def test_cann_mode_names():
    assert set(MODES) == set(CANN_MODES)
    assert resolve_mode(None, get_target("ascend910b")) == "must_keep_origin_dtype"
    assert resolve_mode("Force-FP16", get_target("ascend910b")) == "force_fp16"


def test_unknown_mode_is_named():
    with pytest.raises(PrecisionModeError, match="unknown precision mode 'fp8'.*force_fp16"):
        resolve_mode("fp8", get_target("ascend910b"))


@pytest.mark.parametrize("mode", ["force_bf16", "allow_mix_precision_bf16"])
def test_bf16_refused_on_310p(mode):
    assert resolve_mode(mode, get_target("ascend910b")) == mode
    with pytest.raises(PrecisionModeError, match="ascend310p.*bfloat16|bfloat16.*ascend310p"):
        resolve_mode(mode, get_target("ascend310p"))


def test_compile_model_refuses_bf16_on_310p_before_building():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(out)
    with pytest.raises(PrecisionModeError, match="ascend310p"):
        af.compile_model(bb.get(), "ascend310p", precision_mode="force_bf16")


def test_plan_storage_dtype():
    assert PrecisionPlan("force_fp16").storage_dtype == "float16"
    assert PrecisionPlan("allow_mix_precision_bf16").storage_dtype == "bfloat16"
    assert PrecisionPlan("allow_mix_precision").keeps_fp32_ops and not PrecisionPlan("force_fp16").keeps_fp32_ops
    # keep the model's dtypes: an fp16 model stays fp16 between kernels, an fp32 model fp32
    assert PrecisionPlan("must_keep_origin_dtype", {"float16"}).storage_dtype == "float16"
    assert PrecisionPlan("must_keep_origin_dtype").storage_dtype is None
    # force_fp32: float32 even for a model stored in fp16
    assert PrecisionPlan("force_fp32", {"float16"}).storage_dtype is None
