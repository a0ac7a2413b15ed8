"""MatMulQuantFusionPass: QDQ MatMul/Gemm computed in int8, checked against onnxruntime in quantization steps."""

import numpy as np
import pytest
import tvm

from tests.graph_fusion.common import run_pass
from tests.graph_fusion.quant_models import qdq_model
from tests.graph_fusion.test_conv_quant import _check, _kept
from tvm_ascendfuse.graph_fusion import MatMulQuantFusionPass as P

CASES = [dict(op="matmul"), dict(op="gemm"), dict(op="matmul", act="uint8"), dict(op="gemm", per_channel=False),
         dict(op="gemm", relu=True, requant=False), dict(op="matmul", bias=False, residual=True),
         dict(op="gemm", rows=1)]


def _matmuls(mod):
    return [b.value for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, tvm.relax.Call) and getattr(b.value.op, "name", "") == "relax.matmul"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_int8_matmul_matches_onnxruntime(case):
    model = qdq_model(**case)
    out, rec = run_pass(P, _kept(model))
    assert (rec.match_times, rec.effect_times) == (1, 1)
    (mm,) = _matmuls(out)
    assert (str(mm.args[0].ty.dtype), str(mm.args[1].ty.dtype), str(mm.ty.dtype)) == ("uint8", "int8", "int32")
    _check(model)


def test_switched_off_keeps_the_float_matmul():
    model = qdq_model("gemm")
    out, rec = run_pass(P, _kept(model), enabled=False)
    assert rec.match_times == 1 and rec.effect_times == 0
    assert [str(m.ty.dtype) for m in _matmuls(out)] == ["float32"]
    _check(model, switches={"GraphFusion": {"MatMulQuantFusionPass": "off"}})


def test_per_row_weight_scales_are_refused():
    """Scales along K (axis 0 of a MatMul weight) cannot move behind the sum."""
    model = qdq_model("matmul", cin=24, cout=24)
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "wq"][0]
    dq.attribute[0].i = 0
    out, rec = run_pass(P, _kept(model))
    assert rec.effect_times == 0 and "per output channel" in rec.not_effective[0]["failed"]
    _check(model)
