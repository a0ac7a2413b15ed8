"""ONNX LSTM / GRU / RNN (``onnx_recurrent``): the ONNX backend node cases, and hand-built models for the
attribute combinations those cases leave out, compiled with our pipeline and compared with onnxruntime
(agreement within 1e-4 of each output's scale)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_ascendfuse as af
from tests.conformance import onnx_cases
from tests.helpers import assert_close, run_vm
from tvm_ascendfuse.errors import UnsupportedOpError
from tvm_ascendfuse.frontend import import_onnx

ort = pytest.importorskip("onnxruntime")

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OUTPUTS = {"LSTM": ["Y", "Y_h", "Y_c"], "GRU": ["Y", "Y_h"], "RNN": ["Y", "Y_h"]}


def recurrent_model(op: str, seq=4, batch=3, inp=5, hidden=6, direction="forward", layout=0, bias=True,
                    seq_lens=None, initial=False, peepholes=False, seed=0, **attrs) -> onnx.ModelProto:
    """One ``op`` node with constant weights (what an exporter writes); X (and sequence_lens when given) are
    the graph's inputs, every output is the graph's."""
    rng = np.random.default_rng(seed)
    nd = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    inits = [numpy_helper.from_array(rng.uniform(-0.5, 0.5, (nd, g * hidden, inp)).astype("float32"), "W"),
             numpy_helper.from_array(rng.uniform(-0.5, 0.5, (nd, g * hidden, hidden)).astype("float32"), "R")]
    names = ["X", "W", "R", "", "", "", "", ""]
    if bias:
        inits.append(numpy_helper.from_array(rng.uniform(-0.5, 0.5, (nd, 2 * g * hidden)).astype("float32"), "B"))
        names[3] = "B"
    x_shape = [seq, batch, inp] if layout == 0 else [batch, seq, inp]
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    if seq_lens is not None:
        graph_inputs.append(helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, [batch]))
        names[4] = "sequence_lens"
    state_shape = [nd, batch, hidden] if layout == 0 else [batch, nd, hidden]
    if initial:
        for k, name in ((5, "initial_h"), (6, "initial_c")):
            if name == "initial_c" and op != "LSTM":
                continue
            inits.append(numpy_helper.from_array(rng.uniform(-1, 1, state_shape).astype("float32"), name))
            names[k] = name
    if peepholes:
        inits.append(numpy_helper.from_array(rng.uniform(-0.5, 0.5, (nd, 3 * hidden)).astype("float32"), "P"))
        names[7] = "P"
    while names and names[-1] == "":
        names.pop()
    y_shape = [seq, nd, batch, hidden] if layout == 0 else [batch, seq, nd, hidden]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, y_shape if o == "Y" else state_shape)
            for o in OUTPUTS[op]]
    node = helper.make_node(op, names, OUTPUTS[op], hidden_size=hidden, direction=direction,
                            **({"layout": layout} if layout else {}), **attrs)
    graph = helper.make_graph([node], op.lower(), graph_inputs, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _inputs(model, seq_lens, seed=1):
    rng = np.random.default_rng(seed)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = {"X": rng.standard_normal(shape).astype("float32")}
    if seq_lens is not None:
        feeds["sequence_lens"] = np.asarray(seq_lens, dtype="int32")
    return feeds


def _as_layout0(model):
    """The same node with ``layout`` 0 (onnxruntime runs batch-first recurrences not at all): initial states
    transposed to (directions, batch, hidden), X and the outputs transposed by the caller."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    node = out.graph.node[0]
    keep = [a for a in node.attribute if a.name != "layout"]
    del node.attribute[:]
    node.attribute.extend(keep)
    for t in out.graph.initializer:
        if t.name in ("initial_h", "initial_c"):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).transpose(1, 0, 2).copy(), t.name))
    for vi in list(out.graph.input) + list(out.graph.output):
        dims = vi.type.tensor_type.shape.dim
        values = [d.dim_value for d in dims]
        perm = {"X": (1, 0, 2), "Y": (1, 2, 0, 3)}.get(vi.name, (1, 0, 2) if len(values) == 3 else None)
        if perm is None:
            continue
        for d, p in zip(dims, perm):
            d.dim_value = values[p]
    return out


def onnxruntime_outputs(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    layout = next((a.i for a in model.graph.node[0].attribute if a.name == "layout"), 0)
    if layout == 1:
        model = _as_layout0(model)
        feeds = dict(feeds, X=feeds["X"].transpose(1, 0, 2).copy())
    outs = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    if layout == 1:   # Y (seq, dirs, batch, hidden) -> (batch, seq, dirs, hidden); states -> (batch, dirs, hidden)
        outs = [o.transpose(2, 0, 1, 3) if o.ndim == 4 else o.transpose(1, 0, 2) for o in outs]
    return outs


def check_against_ort(model, seq_lens=None):
    feeds = _inputs(model, seq_lens)
    want = onnxruntime_outputs(model, feeds)
    result = af.compile_model(import_onnx(model), portable=True)
    got = run_vm(result.executable, [feeds[i.name] for i in model.graph.input])
    got = [got] if not isinstance(got, (list, tuple)) else list(got)
    assert len(got) == len(want)
    for name, g, w in zip(OUTPUTS[model.graph.node[0].op_type], got, want):
        assert g.shape == w.shape, (name, g.shape, w.shape)
        assert_close(g, w, rtol=1e-4, atol=1e-4, err_msg=name)
    return result


# -- the ONNX backend node cases (TVM alone cannot import them) ---------------------------------------------
_CASES = [c for m in ("lstm", "gru", "rnn") for c in onnx_cases._import_generator(m)]


def test_backend_cases_are_all_there():
    assert len(_CASES) == 18, [c.name for c in _CASES]


@pytest.mark.parametrize("case", _CASES, ids=[c.name for c in _CASES])
def test_onnx_backend_case(case):
    out = onnx_cases.run_case(case, onnx_cases.compile_ascendfuse, mod=import_onnx(case.model))
    assert out.ok, f"{out.status}: {out.detail}"


# -- attribute combinations the backend cases miss ------------------------------------------------------
LSTM_CASES = {
    "reverse_initial_states": dict(direction="reverse", initial=True),
    "bidirectional_layout1_peepholes": dict(direction="bidirectional", layout=1, initial=True, peepholes=True),
    "bidirectional_sequence_lens": dict(direction="bidirectional", initial=True, seq_lens=[4, 2, 1]),
    "layout1_sequence_lens_peepholes": dict(layout=1, peepholes=True, seq_lens=[3, 4, 1]),
    "clip_activations": dict(direction="bidirectional", clip=0.7,
                             activations=["HardSigmoid", "ScaledTanh", "Affine", "Sigmoid", "Tanh", "Softsign"],
                             activation_alpha=[0.3, 1.5, 0.8], activation_beta=[0.4, 0.6, 0.1]),
    "input_forget_no_bias": dict(input_forget=1, bias=False, initial=True),
}
GRU_CASES = {
    "bidirectional_linear_before_reset": dict(direction="bidirectional", linear_before_reset=1, initial=True),
    "reverse_linear_before_reset0_layout1": dict(direction="reverse", layout=1, initial=True),
    "sequence_lens_lbr1": dict(direction="bidirectional", linear_before_reset=1, seq_lens=[2, 4, 3]),
    "sequence_lens_lbr0_layout1": dict(direction="bidirectional", layout=1, seq_lens=[1, 4, 2], initial=True),
    "clip_activations": dict(clip=0.5, activations=["LeakyRelu", "Elu"], activation_alpha=[0.2, 0.9]),
    "lbr1_no_bias_activations": dict(linear_before_reset=1, bias=False,
                                     activations=["ThresholdedRelu", "Softplus"], activation_alpha=[0.1]),
}
RNN_CASES = {
    "bidirectional_layout1_initial": dict(direction="bidirectional", layout=1, initial=True),
    "reverse_sequence_lens": dict(direction="reverse", seq_lens=[4, 1, 3], initial=True),
    "relu_clip": dict(clip=0.3, activations=["Relu"]),
    "bidirectional_two_activations": dict(direction="bidirectional", activations=["Sigmoid", "LeakyRelu"],
                                          activation_alpha=[0.05]),
}
ALL_CASES = [("LSTM", k, v) for k, v in LSTM_CASES.items()] + [("GRU", k, v) for k, v in GRU_CASES.items()] + \
            [("RNN", k, v) for k, v in RNN_CASES.items()]


@pytest.mark.parametrize("op,name,kw", ALL_CASES, ids=[f"{op}-{name}" for op, name, _ in ALL_CASES])
def test_matches_onnxruntime(op, name, kw):
    kw = dict(kw)
    seq_lens = kw.pop("seq_lens", None)
    check_against_ort(recurrent_model(op, seq_lens=seq_lens, **kw), seq_lens)


# the whole-layer kernel (recurrence_kernel) takes the default activations without clip, sequence_lens,
# peepholes or input_forget; these attributes keep a layer unrolled step by step
UNROLLED = {"LSTM": {"peepholes": True}, "GRU": {"linear_before_reset": 1, "clip": 50.0}, "RNN": {"clip": 50.0}}


@pytest.mark.parametrize("unrolled", [False, True], ids=["layer_kernel", "unrolled"])
def test_input_projection_is_one_gemm_before_the_loop(unrolled):
    """Every step's input product is in one GEMM of seq x batch rows; the steps multiply only the state
    (inside the layer's kernel, or one product per unrolled step)."""
    from tvm import relax

    mod = import_onnx(recurrent_model("LSTM", seq=5, batch=2, inp=7, hidden=3,
                                      **(UNROLLED["LSTM"] if unrolled else {})))
    rows = []

    def visit(e):
        if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.matmul":
            rows.append(int(e.args[0].ty.shape[0]))
    relax.analysis.post_order_visit(mod["main"].body, visit)
    assert sorted(rows) == ([2] * 5 if unrolled else []) + [10], rows


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_unrolled_step_is_one_gemv_kernel(op):
    """Unrolled, each step's recurrent product, gates and state update are one kernel on the GEMV rule, and
    the steps share that kernel's function (their projection rows come by index, not compiled-in slice
    bounds)."""
    seq = 6
    result = af.compile_model(import_onnx(recurrent_model(op, seq=seq, batch=1, inp=8, hidden=16, **UNROLLED[op])),
                              portable=True)
    # a kernel with a product and an activation is a step (the projection has no activation; step 0
    # starts from the zero state, so it has no product)
    steps = [k for k in result.report.kernels
             if "G" in k["kinds"] and any(str(o).startswith(("tir_sigmoid", "tir_tanh")) for o in k["ops"])]
    assert steps and all(k.get("rule") == "gemv" for k in steps), [(k.get("rule"), k["ops"]) for k in steps]
    assert sum(k["launches"] for k in steps) == seq - 1, [(k["launches"], k["ops"]) for k in steps]
    assert len(steps) <= 2, [k["ops"] for k in steps]       # the last step also writes Y


LAYER_CASES = {
    # several panels, batch rows, both directions, batch-first, initial states, unit counts that are not whole
    # vectors (hidden 40: panels of 20 units), no bias
    "LSTM-bidirectional_layout1_two_panels": ("LSTM", dict(direction="bidirectional", layout=1, initial=True,
                                                           hidden=40, batch=2)),
    "LSTM-reverse_no_bias_two_panels": ("LSTM", dict(direction="reverse", bias=False, hidden=64, batch=1)),
    "GRU-bidirectional_three_panels": ("GRU", dict(direction="bidirectional", linear_before_reset=1, hidden=48,
                                                   initial=True)),
    "GRU-reverse_layout1_no_bias": ("GRU", dict(direction="reverse", linear_before_reset=1, layout=1, bias=False,
                                                hidden=32, batch=2)),
    # without linear_before_reset (ONNX's default): two passes over the panels a step, still one kernel
    "GRU-lbr0_bidirectional_three_panels": ("GRU", dict(direction="bidirectional", hidden=48, initial=True)),
    "GRU-lbr0_reverse_layout1_batch2": ("GRU", dict(direction="reverse", layout=1, hidden=32, batch=2, initial=True)),
    "GRU-lbr0_no_bias_units20": ("GRU", dict(bias=False, hidden=40, batch=1)),
    "RNN-bidirectional_two_panels": ("RNN", dict(direction="bidirectional", hidden=256, batch=1, initial=True)),
    "RNN-reverse_layout1": ("RNN", dict(direction="reverse", layout=1, hidden=24, initial=True)),
}


@pytest.mark.parametrize("name", list(LAYER_CASES))
def test_layer_kernel_matches_onnxruntime(name):
    """A layer the whole-layer kernel takes is one launch (both directions in it), on the recurrence rule (the
    rule the table predicts for it), and agrees with onnxruntime."""
    op, kw = LAYER_CASES[name]
    kw = dict(kw, seq=kw.get("seq", 7))
    result = check_against_ort(recurrent_model(op, **kw))
    layers = [k for k in result.report.kernels if k.get("rule") == "recurrence"]
    assert len(layers) == 1 and layers[0]["launches"] == 1, [(k.get("rule"), k["ops"]) for k in result.report.kernels]
    # the rule table names the kernel's kind and predicts the rule that schedules it
    assert (layers[0]["kinds"], layers[0]["predicted_rule"]) == ("S", "recurrence"), layers[0]


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_layer_kernel_reference_form_builds_with_tvm_alone(op):
    """The converter's kernel is plain TIR: TVM's default pipeline builds the imported model as it is (what
    ``verify`` compares against) and agrees with onnxruntime (the GRU: two passes a step, with its scratch)."""
    from tests.helpers import run_reference

    model = recurrent_model(op, direction="bidirectional", hidden=40, batch=2, initial=True)
    feeds = _inputs(model, None)
    got = run_reference(import_onnx(model), [feeds["X"]])
    for name, g, w in zip(OUTPUTS[op], got, onnxruntime_outputs(model, feeds)):
        assert_close(g, w, rtol=1e-4, atol=1e-4, err_msg=name)


# -- refusals --------------------------------------------------------------------------------------------
def test_symbolic_sequence_length_is_named():
    model = recurrent_model("GRU")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "steps"
    with pytest.raises(UnsupportedOpError, match=r"dimension 0 \(seq_length\) of input X is symbolic \('steps'\)"):
        import_onnx(model)


def test_unknown_activation_is_named():
    model = recurrent_model("RNN")
    model.graph.node[0].attribute.append(helper.make_attribute("activations", ["Swish"]))
    with pytest.raises(UnsupportedOpError, match="activation 'Swish'"):
        import_onnx(model)


def test_missing_activation_parameters_are_named():
    model = recurrent_model("RNN", activations=["Affine"])
    with pytest.raises(UnsupportedOpError, match="Affine.*too few"):
        import_onnx(model)
