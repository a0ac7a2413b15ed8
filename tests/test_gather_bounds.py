"""GatherBoundsCheck: a gather from a table at run-time indices reads inside the table, and an index outside
it (a token id past the vocabulary, a position past the model's learned positions) stops the call with one
line naming its source, where TVM alone reads outside the table (a wrong answer, or a segfault)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import assert_close, compile_ours, run_vm
from tests.shape_models import OPSET, ort_run
from tvm_ascendfuse.frontend import import_onnx

pytest.importorskip("onnxruntime")

ROWS, WIDTH = 10, 4
TABLE = numpy_helper.from_array(np.random.default_rng(0).standard_normal((ROWS, WIDTH)).astype("float32"), "table")


def token_lookup():
    """y = relu(table[ids] @ W): an embedding lookup and a projection."""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((WIDTH, 8)).astype("float32"), "w")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
             helper.make_node("MatMul", ["rows", "w"], ["p"]), helper.make_node("Relu", ["p"], ["y"])]
    graph = helper.make_graph(nodes, "lookup", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8])], [TABLE, w])
    return helper.make_model(graph, opset_imports=OPSET)


def learned_position():
    """GPT-2's position embedding in a decode step: the new token's position is the cache length ``past``
    (Shape of the cache), gathered from a table of ROWS learned positions."""
    nodes = [helper.make_node("Shape", ["past_k"], ["shape"]),
             helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array([2], "int64"))),
             helper.make_node("Gather", ["shape", "two"], ["pos"], axis=0),
             helper.make_node("Gather", ["table", "pos"], ["row"], axis=0),
             helper.make_node("Add", ["x", "row"], ["y"])]
    graph = helper.make_graph(
        nodes, "position", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH]),
                            helper.make_tensor_value_info("past_k", TensorProto.FLOAT, [1, 2, "past", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])], [TABLE])
    return helper.make_model(graph, opset_imports=OPSET)


@pytest.fixture(scope="module")
def lookup():
    model = token_lookup()
    return model, compile_ours(import_onnx(model))


def test_ids_inside_the_table_agree_with_onnxruntime(lookup):
    model, result = lookup
    for ids in ([[1, 2, 3]], [[0, 9, 9]], [[1, -1, -10]]):       # negative ids count from the end (ONNX)
        feeds = {"ids": np.array(ids, "int64")}
        assert_close(run_vm(result.executable, list(feeds.values())), ort_run(model, feeds)[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("bad", [10, 12, 10 ** 9])
def test_an_id_past_the_table_stops_the_call_naming_the_input(lookup, bad):
    _, result = lookup
    with pytest.raises(AssertionError) as err:
        run_vm(result.executable, [np.array([[1, bad, 3]], "int64")])
    text = str(err.value).strip()
    assert "\n" not in text and "input 'ids'" in text and f"{ROWS} rows" in text and str(bad) in text, text


def test_a_position_past_the_learned_positions_names_the_cache_length():
    model = learned_position()
    mod = import_onnx(model)
    result = compile_ours(mod)
    x = np.ones((1, WIDTH), "float32")
    for past in (1, ROWS - 1):
        feeds = {"x": x, "past_k": np.zeros((1, 2, past, 4), "float32")}
        assert_close(run_vm(result.executable, list(feeds.values())), ort_run(model, feeds)[0], rtol=0, atol=1e-6)
    with pytest.raises(AssertionError, match="'past'.*outside the table's 10 rows"):
        run_vm(result.executable, [x, np.zeros((1, 2, ROWS, 4), "float32")])


def test_constant_indices_get_no_check():
    """A gather at constant indices is checked when the model is built: no run-time check, no extra kernel."""
    nodes = [helper.make_node("Constant", [], ["ids"], value=numpy_helper.from_array(np.array([1, 3], "int64"))),
             helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
             helper.make_node("Add", ["rows", "x"], ["y"])]
    graph = helper.make_graph(nodes, "const", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, WIDTH])], [TABLE])
    result = compile_ours(import_onnx(helper.make_model(graph, opset_imports=OPSET)))
    assert not any("max" in "+".join(k["ops"]) for k in result.report.kernels)
