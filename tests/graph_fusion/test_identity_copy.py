"""IdentityCopyFusionPass: a kernel call copying its one input unchanged (an ONNX Pad by zero) is that input."""

import numpy as np
from onnx import helper
from tvm import relax, tirx

from tests.graph_fusion.common import assert_same_after, assert_switched_off, onnx_model, run_pass, run_ort
from tests.helpers import assert_close, tol
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import IdentityCopyFusionPass as P
from tvm_ascendfuse.graph_fusion.identity_copy import is_identity_copy


def pads_onnx(zero_pad, real_pad):
    """x -> LayerNorm-free chain: Relu -> Pad(zero_pad) -> Sigmoid -> Pad(real_pad) -> Relu (NHWC pads)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Pad", ["a", "p0"], ["b"], mode="constant"),
             helper.make_node("Sigmoid", ["b"], ["c"]),
             helper.make_node("Pad", ["c", "p1"], ["d"], mode="constant"),
             helper.make_node("Relu", ["d"], ["y"])]
    shape = (1, 5, 6, 3)
    out = [s + real_pad[i] + real_pad[i + 4] for i, s in enumerate(shape)]
    return onnx_model(nodes, {"x": shape}, {"y": out},
                      {"p0": np.array(zero_pad, "int64"), "p1": np.array(real_pad, "int64")})


def _tir_calls(mod):
    return [b.value.args[0].name_hint for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.call_tir"]


def test_pad_by_zero_removed_real_pad_kept():
    model = pads_onnx([0] * 8, [0, 1, 0, 0, 0, 2, 1, 0])
    mod = import_onnx(model)
    assert len(_tir_calls(mod)) == 2
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert len(_tir_calls(out)) == 1                         # the real pad stays
    got, inputs = assert_same_after(mod, out)
    assert_close(got, run_ort(model, inputs), **tol("float32"))


def test_only_exact_copies():
    model = pads_onnx([0] * 8, [0, 1, 0, 0, 0, 2, 1, 0])
    funcs = {gv.name_hint: f for gv, f in import_onnx(model).functions.items() if isinstance(f, tirx.PrimFunc)}
    verdicts = sorted(is_identity_copy(f) for f in funcs.values())
    assert verdicts == [False, True]


def test_switched_off():
    assert_switched_off(P, import_onnx(pads_onnx([0] * 8, [0, 0, 1, 1, 0, 0, 1, 1])), 1)
