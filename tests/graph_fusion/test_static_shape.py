"""StaticShapeCanonicalizePass on models TVM alone cannot lower: shape arithmetic on static tensors evaluated,
so the slices/reshapes it feeds get static shapes before legalization.

The ONNX graphs come from ``tests/shape_models.py`` (torch's export form, built without torch) and are
imported with TVM's own importer, so the Relax pass (not the ONNX-level folding of the frontend) repairs them.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tests.graph_fusion.common import ops, run_pass
from tests.helpers import assert_close, compile_ours, run_vm
from tests.shape_models import channel_shuffle, ort_run, runtime_reshape
from tvm_ascendfuse.errors import UnsupportedOpError
from tvm_ascendfuse.graph_fusion.static_shape import StaticShapeCanonicalizePass

PASS = StaticShapeCanonicalizePass.switch_name


def _import(model):
    from tvm.relax.frontend.onnx import from_onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_onnx(model)


def _tvm_default(mod):
    target = tvm.target.Target("llvm")
    return tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))


def test_channel_shuffle_tvm_alone_fails():
    """The reason for the pass: TVM's default pipeline cannot build ShuffleNetV2's unit."""
    with pytest.raises(Exception, match="emit_te now only supports Tensor that has ShapeExpr shape"):
        _tvm_default(_import(channel_shuffle()))


def test_channel_shuffle_repaired_matches_onnxruntime():
    pytest.importorskip("onnxruntime")
    model = channel_shuffle()
    mod = _import(model)
    assert "dynamic_strided_slice" in ops(mod)
    repaired, record = run_pass(StaticShapeCanonicalizePass, mod)
    assert record.effect_times == 2 and record.match_times == 2            # the two halves of the chunk
    assert "dynamic_strided_slice" not in ops(repaired) and "shape_of" not in ops(repaired)
    out_ty = repaired["main"].body.body.ty
    assert [int(d) for d in out_ty.shape.values] == [1, 8, 4, 4]
    result = compile_ours(mod)
    x = np.random.default_rng(0).standard_normal((1, 8, 4, 4)).astype("float32")
    assert_close(run_vm(result.executable, [x]), ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    section = result.report.sections["static_shapes"]["main"]
    assert section["repaired"] == 2 and section["bindings_made_static"] > 2 and section["still_unknown"] == 0
    rec = result.report.to_dict()["graph_fusion"][PASS]
    assert rec["effect_times"] == 2


def test_switched_off_counts_and_the_op_tvm_cannot_lower_is_named():
    mod = _import(channel_shuffle())
    unchanged, record = run_pass(StaticShapeCanonicalizePass, mod, enabled=False)
    assert unchanged.same_as(mod) or "dynamic_strided_slice" in ops(unchanged)
    assert record.match_times == 2 and record.effect_times == 0
    assert all(e["reason"] == "switched_off" for e in record.not_effective)
    with pytest.raises(UnsupportedOpError, match=r"cannot lower operator '(reshape|concat)' .*known only at run "
                                                 r"time"):
        compile_ours(mod, switches={PASS: "off"})


def test_reshape_to_a_shape_computed_from_shape_of():
    """Relax-level: ``reshape(x, tensor_to_shape(concat(take(shape_of(x), 0) * take(.., 1), -1)))`` then an
    op: the target shape is evaluated to a ShapeExpr, the result is static and the numbers are TVM's."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(relax.op.shape_to_tensor(bb.emit(relax.op.shape_of(x))))
            rows = bb.emit(relax.op.multiply(relax.op.take(s, relax.const([0], "int64"), axis=0),
                                             relax.op.take(s, relax.const([1], "int64"), axis=0)))
            target = bb.emit(relax.op.concat([rows, relax.const(np.array([-1]), "int64")], axis=0))
            shape = bb.emit(relax.op.tensor_to_shape(target))
            flat = bb.emit(relax.op.reshape(x, shape))
            out = bb.emit_output(relax.op.nn.softmax(flat, axis=-1))
        bb.emit_func_output(out)
    mod = bb.get()
    assert not isinstance(mod["main"].body.body.ty.shape, relax.ShapeExpr)     # a shape variable before
    repaired, record = run_pass(StaticShapeCanonicalizePass, mod)
    assert record.effect_times == 1
    assert [int(d) for d in repaired["main"].body.body.ty.shape.values] == [6, 4]
    xv = np.random.default_rng(1).standard_normal((2, 3, 4)).astype("float32")
    got = run_vm(compile_ours(mod).executable, [xv])
    e = np.exp(xv.reshape(6, 4) - xv.reshape(6, 4).max(-1, keepdims=True))
    assert_close(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_values_read_at_run_time_are_left_and_recorded():
    """A slice whose end is an input cannot be made static: recorded as not repaired, and the model compiles
    as TVM compiles it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    e = relax.Var("e", relax.TensorType((2,), "int64"))
    with bb.function("main", [x, e]):
        with bb.dataflow():
            sl = bb.emit(relax.op.dynamic_strided_slice(x, relax.const(np.array([0, 0]), "int64"), e,
                                                        relax.const(np.array([1, 1]), "int64")))
            out = bb.emit_output(relax.op.nn.relu(sl))
        bb.emit_func_output(out)
    mod = bb.get()
    repaired, record = run_pass(StaticShapeCanonicalizePass, mod)
    assert record.effect_times == 0
    assert any("read at run time" in r.get("failed", "") for r in record.not_effective)
    xv = np.arange(16, dtype="float32").reshape(2, 8) - 8
    got = run_vm(compile_ours(mod).executable, [xv, np.array([2, 5], "int64")])
    np.testing.assert_array_equal(got, np.maximum(xv[:, :5], 0))


def test_static_modules_are_untouched():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((tirx.Var("n", "int64"), 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(out)
    mod = bb.get()
    same, record = run_pass(StaticShapeCanonicalizePass, mod)
    assert same.same_as(mod) and record.match_times == 0


def test_evaluated_ops_follow_tvm_semantics():
    """The int ops the pass evaluates give what TVM computes: truncating division (also of negatives), take
    in wrap/clip/fast modes, where, scatter, concat, squeeze/expand_dims. The values feed a reshape whose
    target the pass makes static; the module's int outputs are compared with TVM's default build of the
    unrepaired module's int part."""
    o = relax.op

    def i64(values):
        return relax.const(np.array(values), "int64")

    def build(with_reshape: bool):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((2, 3, 4, 5), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                s = bb.emit(o.shape_to_tensor(bb.emit(o.shape_of(x))))                       # [2, 3, 4, 5]
                neg = bb.emit(o.subtract(i64([0, 0, 0, 0]), s))                              # [-2, -3, -4, -5]
                div = bb.emit(o.divide(neg, i64([2, 2, 3, 2])))                             # trunc: [-1, -1, -1, -2]
                fdiv = bb.emit(o.floor_divide(neg, i64([2, 2, 3, 2])))                      # floor: [-1, -2, -2, -3]
                wrap = bb.emit(o.take(s, i64([-1, 4]), axis=0, mode="wrap"))                 # [5, 2]
                clip = bb.emit(o.take(s, i64([7]), axis=0, mode="clip"))                     # [5]
                fast = bb.emit(o.take(s, i64([1]), axis=0, mode="fast"))                     # [3]
                sel = bb.emit(o.where(o.less(div, fdiv), div, fdiv))                         # [-1, -2, -2, -3]
                sc = bb.emit(o.scatter_elements(s, i64([-1]), i64([1]), axis=0))             # [2, 3, 4, 1]
                cat = bb.emit(o.concat([wrap, clip, fast], axis=0))                          # [5, 2, 5, 3]
                sq = bb.emit(o.squeeze(o.expand_dims(cat, [0]), [0]))
                ints = [div, fdiv, wrap, clip, fast, sel, sc, sq]
                outs = list(ints)
                if with_reshape:
                    rows = bb.emit(o.multiply(o.take(sc, i64([0]), axis=0), o.take(sc, i64([1]), axis=0)))
                    target = bb.emit(o.concat([rows, i64([-1])], axis=0))                  # [6, -1] -> (6, 20)
                    outs.append(bb.emit(o.reshape(x, bb.emit(o.tensor_to_shape(target)))))
                out = bb.emit_output(relax.Tuple(outs))
            bb.emit_func_output(out)
        return bb.get()

    expected = [[-1, -1, -1, -2], [-1, -2, -2, -3], [5, 2], [5], [3], [-1, -2, -2, -3], [2, 3, 4, 1], [5, 2, 5, 3]]
    ref = run_vm(_tvm_default(build(False)), [np.zeros((2, 3, 4, 5), "float32")])
    assert [r.tolist() for r in ref] == expected                          # TVM's own semantics, as written
    repaired, record = run_pass(StaticShapeCanonicalizePass, build(True))
    assert record.effect_times == 1
    fields = repaired["main"].body.body.ty.fields
    assert [int(d) for d in fields[-1].shape.values] == [6, 20]
    xv = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype("float32")
    got = run_vm(compile_ours(build(True)).executable, [xv])
    assert [g.tolist() for g in got[:-1]] == expected
    np.testing.assert_array_equal(got[-1], xv.reshape(6, 20))
