"""The frontend's shape folding (``onnx_shapes.fold_shapes``, ``import_onnx(fold_shapes=True)``): models whose
shape computations TVM's importer cannot take are imported and match onnxruntime; what cannot be folded is
reported by name (``ascendfuse compile``: one line, exit code 2)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper

from tests.helpers import assert_close, compile_ours, run_vm
from tests.shape_models import channel_shuffle, ort_run, runtime_pad, runtime_reshape, window_reshape
from tvm_ascendfuse.cli import main
from tvm_ascendfuse.errors import UnsupportedOpError
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.onnx_shapes import fold_shapes

pytest.importorskip("onnxruntime")


def _tvm_import(model):
    from tvm.relax.frontend.onnx import from_onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_onnx(model)


@pytest.mark.parametrize("batch", [1, None], ids=["static", "symbolic_batch"])
def test_window_partition_tvm_rejects_folded_imports_and_matches(batch, capsys):
    model = window_reshape(batch=batch)
    with pytest.raises(Exception, match="Dynamic pads"):
        _tvm_import(model)
    folded, summary = fold_shapes(model)
    ops = [n.op_type for n in folded.graph.node]
    assert "Mod" not in ops and "Div" not in ops and "Sub" not in ops     # the pad/view arithmetic is gone
    assert summary.total >= 14
    if batch == 1:
        assert summary.shape_ops == 2 and "Shape" not in ops
    else:
        assert ops.count("Shape") == 2          # the batch is symbolic: Shape stays, its static entries fold
    mod = import_onnx(model)
    result = compile_ours(mod)
    assert result.report.sections["frontend"]["shape_folding"]["nodes_folded"] == summary.total
    for b in ([1] if batch == 1 else [2, 3]):
        x = np.random.default_rng(b).standard_normal((b, 6, 6, 4)).astype("float32")
        np.testing.assert_array_equal(run_vm(result.executable, [x]), ort_run(model, {"x": x})[0])


def test_channel_shuffle_through_the_frontend():
    model = channel_shuffle()
    result = compile_ours(import_onnx(model))
    x = np.random.default_rng(0).standard_normal((1, 8, 4, 4)).astype("float32")
    assert_close(run_vm(result.executable, [x]), ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert result.report.sections["frontend"]["shape_folding"]["shape_of_static_tensors"] == 1


def test_switched_off_imports_as_tvm_does_and_names_the_op():
    with pytest.raises(UnsupportedOpError, match=r"cannot import ONNX operator 'Pad': Dynamic pads"):
        import_onnx(window_reshape(), fold_shapes=False)
    mod = import_onnx(channel_shuffle(), fold_shapes=False)
    assert dict(mod.attrs["ascendfuse.frontend"])["shape_folding"] == "off"


def test_values_from_inputs_and_random_ops_are_not_folded():
    model, summary = fold_shapes(runtime_reshape())
    assert summary.total == 0
    rnd = helper.make_model(helper.make_graph(
        [helper.make_node("RandomUniform", [], ["r"], shape=[2]), helper.make_node("Add", ["x", "r"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]), opset_imports=[helper.make_opsetid("", 17)])
    folded, summary = fold_shapes(rnd)
    assert summary.total == 0 and [n.op_type for n in folded.graph.node] == ["RandomUniform", "Add"]


@pytest.mark.parametrize("build, op, why", [
    (runtime_pad, "Pad", "Dynamic pads are not supported yet"),
    (runtime_reshape, "Reshape", "Reshape expects the input tensor to have known shape"),
], ids=["pad", "reshape"])
def test_cli_names_the_op_tvm_cannot_import(tmp_path, capsys, build, op, why):
    path = tmp_path / "m.onnx"
    onnx.save(build(), str(path))
    code = main(["compile", str(path), "-o", str(tmp_path / "out"), "--no-traffic-baseline"])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1, captured.err
    assert f"cannot import ONNX operator '{op}'" in lines[0] and why in lines[0] and tvm.__version__ in lines[0]
    assert "Error converting operator" not in captured.out    # TVM's own print is not passed on


def test_cli_no_shape_folding_flag(tmp_path, capsys):
    path = tmp_path / "w.onnx"
    onnx.save(window_reshape(), str(path))
    assert main(["compile", str(path), "-o", str(tmp_path / "a"), "--no-traffic-baseline"]) == 0
    capsys.readouterr()
    assert main(["compile", str(path), "-o", str(tmp_path / "b"), "--no-traffic-baseline",
                 "--no-shape-folding"]) == 2
    assert "cannot import ONNX operator 'Pad'" in capsys.readouterr().err
