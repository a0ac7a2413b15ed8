"""RecurrenceRule: a whole recurrent layer (``recurrence_kernel``) scheduled with its panels over the cores -
numbers equal to the reference form TVM builds as it is (several panels, batch rows, both directions, unit
counts that are not whole vectors); kernels the converters did not tag are declined."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from tests.schedule.kernels import HOST, check_rule, fused_kernel
from tvm_ascendfuse.recurrence_kernel import LayerSpec, layer_kernel, panel_units
from tvm_ascendfuse.schedule.recurrence import RecurrenceRule
from tvm.relax import op

SPECS = {
    # kind, steps, batch, hidden, directions, reverse
    "lstm_two_panels": ("lstm", 5, 1, 64, 1, False),
    "lstm_bidirectional_batch2_units20": ("lstm", 4, 2, 40, 2, False),
    "gru_bidirectional_three_panels": ("gru", 5, 1, 48, 2, False),
    "gru_reverse_batch3": ("gru", 3, 3, 32, 1, True),
    "gru_lbr0_bidirectional_batch2": ("gru_lbr0", 4, 2, 48, 2, False),
    "gru_lbr0_reverse_units20": ("gru_lbr0", 5, 1, 40, 1, True),
    "rnn_reverse_units24": ("rnn", 6, 2, 24, 1, True),
    "rnn_bidirectional_two_panels": ("rnn", 4, 1, 256, 2, False),
}


def _spec(kind, steps, batch, hidden, dirs, reverse):
    return LayerSpec(kind, steps, batch, hidden,
                     panel_units(hidden, {"lstm": 4, "gru": 3, "gru_lbr0": 3, "rnn": 1}[kind], batch), dirs, reverse)


@pytest.mark.parametrize("name", list(SPECS))
def test_scheduled_layer_matches_reference(name):
    spec = _spec(*SPECS[name])
    func = layer_kernel(spec, scheduled=False).with_attr("global_symbol", "main")
    rng = np.random.default_rng(1)
    # a weight of the scale an exporter gives (1/sqrt(hidden)): gates away from saturation
    w = (rng.standard_normal([int(d) for d in func.params[1].ty.shape]) / np.sqrt(spec.hidden)).astype("float32")
    mod, note = check_rule(RecurrenceRule(), func, fixed={1: w}, with_note=True)
    assert "in one kernel" in note and f"{spec.panels} panels" in note


def test_panels_are_parallel_on_several_cores_and_serial_on_one():
    spec = _spec("lstm", 3, 1, 64, 2, False)
    func = layer_kernel(spec, scheduled=False)
    two = RecurrenceRule().apply(func, None, HOST).mod["main"]
    one = RecurrenceRule().apply(func, None, tvm.target.Target({"kind": "llvm", "num-cores": 1})).mod["main"]
    assert "T.parallel" in two.script() and "T.parallel" not in one.script()


def test_untagged_kernels_are_declined():
    func = fused_kernel(lambda x, w: op.matmul(x, w), [(1, 64), (64, 256)])
    check_rule(RecurrenceRule(), func, expect=False)
