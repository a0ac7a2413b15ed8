"""``from_torch`` with ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN``: one layer kernel per layer (the kernel the ONNX
converters build, ``recurrent_layer``), agreeing with eager PyTorch; and through ``torch.compile``. Skipped
without torch (an optional extra)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tvm_ascendfuse as af  # noqa: E402
from tests.helpers import assert_close, run_vm  # noqa: E402
from tvm_ascendfuse import recurrent_layer  # noqa: E402

MODULES = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "RNN": torch.nn.RNN}
CASES = {
    # (module, constructor keywords, initial states given)
    "LSTM-two_layers_batch_first": ("LSTM", dict(num_layers=2, batch_first=True), False),
    "LSTM-two_layers_bidirectional_initial": ("LSTM", dict(num_layers=2, bidirectional=True), True),
    "LSTM-no_bias_batch_first_initial": ("LSTM", dict(bias=False, batch_first=True), True),
    "LSTM-bidirectional_two_panels": ("LSTM", dict(bidirectional=True, hidden_size=40), False),
    "GRU-two_layers_bidirectional_batch_first": ("GRU", dict(num_layers=2, bidirectional=True, batch_first=True),
                                                 False),
    "GRU-no_bias_initial": ("GRU", dict(bias=False), True),
    "GRU-two_layers_initial_three_panels": ("GRU", dict(num_layers=2, hidden_size=48), True),
    "RNN-bidirectional_batch_first_initial": ("RNN", dict(bidirectional=True, batch_first=True), True),
}
SEQ, BATCH, INPUT, HIDDEN = 6, 3, 10, 16


def _case(name, seed=0):
    kind, kw, initial = CASES[name]
    kw = dict(kw)
    hidden = kw.pop("hidden_size", HIDDEN)
    torch.manual_seed(seed)
    model = MODULES[kind](INPUT, hidden, **kw).eval()
    x = torch.randn((BATCH, SEQ, INPUT) if kw.get("batch_first") else (SEQ, BATCH, INPUT))
    args = (x,)
    if initial:
        h = torch.randn(kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1), BATCH, hidden)
        args = (x, (h, torch.randn_like(h)) if kind == "LSTM" else h)
    return model, args


def _flat(value):
    if isinstance(value, torch.Tensor):
        return [value.numpy()]
    return [a for v in value for a in _flat(v)]


def _layers(model) -> int:
    return model.num_layers


@pytest.mark.parametrize("name", list(CASES))
def test_from_torch_matches_eager_one_kernel_per_layer(name):
    model, args = _case(name)
    with torch.no_grad():
        want = _flat(model(*args))
    result = af.compile_model(af.from_torch(model, args), portable=True)
    got = run_vm(result.executable, _flat(args))
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    assert [g.shape for g in got] == [w.shape for w in want]
    # every output (output, h_n, c_n) on its own scale
    assert_close(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
    kernels = result.report.kernels
    layers = [k for k in kernels if k.get("rule") == "recurrence"]
    # one launch per layer (both directions in it), and no unrolled chain of step kernels beside them
    assert sum(k["launches"] for k in layers) == _layers(model), [(k.get("rule"), k["ops"]) for k in kernels]
    steps = [k for k in kernels if k.get("rule") != "recurrence"
             and any(str(o).startswith(("tir_sigmoid", "tir_tanh")) for o in k["ops"])]
    assert not steps, [k["ops"] for k in steps]


def test_float16_layer_is_computed_in_float32():
    model = torch.nn.LSTM(INPUT, HIDDEN, num_layers=2).eval()
    x = torch.randn(SEQ, BATCH, INPUT)
    with torch.no_grad():
        want = _flat(model(x))           # float32 eager: the kernel's own precision
        half = model.half()
        result = af.compile_model(af.from_torch(half, (x.half(),)), portable=True)
    got = run_vm(result.executable, [x.half().numpy()])
    assert all(g.dtype == np.float16 for g in got)
    # the weights rounded to float16 and the outputs rounded back: a few float16 steps of the output's scale
    assert_close([g.astype("float32") for g in got], want, rtol=0, atol=1e-2)
    layers = [k for k in result.report.kernels if k.get("rule") == "recurrence"]
    assert sum(k["launches"] for k in layers) == 2


def test_float64_is_refused_by_name():
    from tvm_ascendfuse.errors import UnsupportedOpError

    model = torch.nn.GRU(INPUT, HIDDEN).double().eval()
    with pytest.raises(UnsupportedOpError,
                       match=r"aten\.gru '.*' on float64: recurrent layers are supported in float32"):
        af.from_torch(model, (torch.randn(SEQ, BATCH, INPUT, dtype=torch.float64),))


def test_projected_lstm_is_spelled_out_by_the_decompositions():
    model = torch.nn.LSTM(INPUT, HIDDEN, proj_size=8).eval()
    x = torch.randn(SEQ, BATCH, INPUT)
    with torch.no_grad():
        want = _flat(model(x))
    result = af.compile_model(af.from_torch(model, (x,)), portable=True)
    got = run_vm(result.executable, [x.numpy()])
    assert_close(list(got), want, rtol=1e-4, atol=1e-4)


class _Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(INPUT, HIDDEN, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(HIDDEN, 4)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def test_torch_compile_builds_the_layer_kernels():
    """dynamo hands an RNN module to a backend only with ``allow_rnn`` (by default it breaks the graph there
    and runs the module in eager PyTorch)."""
    from tvm_ascendfuse import torch_compile as tc

    torch._dynamo.reset()
    tc.clear_cache()
    try:
        model = _Head().eval()
        x = torch.randn(BATCH, SEQ, INPUT)
        fast = torch.compile(model, backend="ascendfuse", options={"portable": True})
        with torch.no_grad(), torch._dynamo.config.patch(allow_rnn=True):
            assert_close(fast(x).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-4)
        assert tc.stats["builds"] == 1 and tc.stats["eager"] == 0
        (_, result), = tc._CACHE.values()
        layers = [k for k in result.report.kernels if k.get("rule") == "recurrence"]
        assert sum(k["launches"] for k in layers) == 2, [(k.get("rule"), k["ops"]) for k in result.report.kernels]
    finally:
        torch._dynamo.reset()
        tc.clear_cache()


def test_reordering_names_unknown_gates():
    from tvm import relax

    bb = relax.BlockBuilder()
    m = relax.const(np.zeros((1, 8, 2), "float32"))
    with pytest.raises(ValueError, match="does not name the gru gates"):
        recurrent_layer._kernel_order(bb, m, "gru", ("update", "reset", "cell"), 2, 1)
