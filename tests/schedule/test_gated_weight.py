"""An SE-gated conv input (``conv(x * g)``) moved onto the weight (``schedule/gated_weight.py``): the conv
rules read ``x`` as for an ungated conv, the numbers stay those of the unscheduled kernel."""

from __future__ import annotations

import pytest
import tvm
from tvm.relax import op

from tests.schedule.kernels import NATIVE, NPU, check_rule, fused_kernel
from tvm_ascendfuse.schedule.conv import Conv2dRule
from tvm_ascendfuse.schedule.gated_weight import gate_on_weight
from tvm_ascendfuse.schedule.padded_conv import PaddedConv2dRule

AVX512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
AVX2 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"})


def _gated(stride=1, pad=0, act=None, gate_first=False):
    def build(x, g, w, b):
        y = op.multiply(g, x) if gate_first else op.multiply(x, g)
        y = op.add(op.nn.conv2d(y, w, strides=stride, padding=pad), b)
        return op.nn.relu(y) if act == "relu" else y
    return build


def _kernel(build, x, oc, gate_batch=None, k=1):
    n, c = x[0], x[1]
    shapes = [x, (gate_batch or n, c, 1, 1), (oc, c, k, k), (1, oc, 1, 1)]
    return fused_kernel(build, shapes).with_attr("layout_free_buffers", [2])


# (build, input shape, OC, gate batch, kernel size, rule, the path the conv takes on AVX-512)
CASES = {
    "pixel_vectors_56": (_gated(), (1, 32, 32, 32), 24, None, 1, Conv2dRule, "pixel vectors"),
    "channel_vectors_14": (_gated(act="relu"), (1, 96, 14, 14), 32, None, 1, Conv2dRule, "ConvTiles"),
    "plane_7_gate_first": (_gated(gate_first=True), (1, 64, 7, 7), 48, None, 1, Conv2dRule, "ConvTiles"),
    # a count neither 8 nor 16 lanes divide (40 would be 5 whole AVX2 vectors: nothing to pad there)
    "padded_oc_44": (_gated(), (1, 48, 28, 28), 44, None, 1, PaddedConv2dRule, "channels padded"),
    "per_sample_gate": (_gated(), (2, 32, 14, 14), 32, None, 1, Conv2dRule, "ConvTiles"),
    "shared_gate_batch_2": (_gated(), (2, 32, 14, 14), 32, 1, 1, Conv2dRule, "ConvTiles"),
    "zero_padded_3x3": (_gated(pad=1), (1, 32, 14, 14), 32, None, 3, Conv2dRule, "ConvTiles"),
    "strided_pointwise": (_gated(stride=2), (1, 32, 28, 28), 32, None, 1, Conv2dRule, "ConvTiles"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gated_conv_matches_the_unscheduled_kernel(name):
    """The gate goes onto the weight (the input's multiply is gone, the conv reads ``x`` itself) and the
    scheduled kernel computes what the unscheduled one does: pixel vectors, channel vectors, a small plane,
    padded output channels, a per-sample and a shared gate with batch 2, a zero-padded 3x3 and a strided
    1x1 conv; on AVX-512 and AVX2 hosts."""
    build, x, oc, gate_batch, k, rule, path = CASES[name]
    func = _kernel(build, x, oc, gate_batch, k)
    moved = gate_on_weight(func)
    assert moved is not None
    script = moved.script()
    assert "T_multiply" not in script and "ascendfuse.gated_weight" in script
    scheduled = rule().apply(func, NPU, AVX512).mod.script()
    assert path in scheduled and "ascendfuse.gated_weight" in scheduled
    check_rule(rule(), func, host=NATIVE)
    check_rule(rule(), func, host=AVX2, seed=1)


def test_gated_pointwise_takes_the_ungated_path():
    """On a 56x56 plane the gated projection runs on pixel vectors with the same register block as the
    ungated conv (the gate used to make it stage its input NCHW[16]c, gathered lane by lane)."""
    def plain(x, w, b):
        return op.add(op.nn.conv2d(x, w), b)
    ungated = fused_kernel(plain, [(1, 144, 56, 56), (24, 144, 1, 1), (1, 24, 1, 1)]) \
        .with_attr("layout_free_buffers", [1])
    gated = _kernel(_gated(), (1, 144, 56, 56), 24)

    def note(func):
        return Conv2dRule().apply_with_note(func, NPU, AVX512).sch.mod.script().split(
            '"ascendfuse.schedule": "')[1].split('"')[0]
    assert "pixel vectors" in note(gated) and note(gated) == note(ungated)


def _full_size_multiply(x, g, w, b):
    return op.add(op.nn.conv2d(op.multiply(x, g), w), b)


def _gated_add(x, g, w, b):
    return op.add(op.nn.conv2d(op.add(x, g), w), b)


@pytest.mark.parametrize("build,gate", [
    (_full_size_multiply, (1, 16, 14, 14)),     # varies along H and W: not a per-channel scale
    (_gated_add, (1, 16, 1, 1)),                # a shift, not a scale
], ids=["full_size_operand", "add"])
def test_other_prologues_stay_on_the_input(build, gate):
    """A full-size product or a per-channel shift is no weight scale: the kernel keeps its prologue, and
    the conv rule's schedule of it is still exact."""
    func = fused_kernel(build, [(1, 16, 14, 14), gate, (32, 16, 1, 1), (1, 32, 1, 1)]) \
        .with_attr("layout_free_buffers", [2])
    assert gate_on_weight(func) is None
    check_rule(Conv2dRule(), func, host=NATIVE)


def test_gated_input_also_an_output_stays_on_the_input():
    """The gated tensor written out as well (read by more than the conv): the multiply stays."""
    from tvm import relax

    def build(x, g, w, b):
        m = op.multiply(x, g)
        return relax.Tuple([m, op.add(op.nn.conv2d(m, w), b)])
    func = fused_kernel(build, [(1, 16, 14, 14), (1, 16, 1, 1), (32, 16, 1, 1), (1, 32, 1, 1)]) \
        .with_attr("layout_free_buffers", [2])
    assert gate_on_weight(func) is None


def test_tuner_searches_the_prepared_kernel():
    """The conv2d rule's ``prepare`` is the gate move, so a tuner searches (and keys its records by) the
    kernel the rule schedules; its tile decision replays. An ungated conv is left as it is."""
    from tests.schedule.kernels import assert_decision_replays
    from tvm_ascendfuse.schedule.apply import _prepares

    func = _kernel(_gated(act="relu"), (1, 96, 14, 14), 32)
    prepared = Conv2dRule.prepare(func)
    assert "ascendfuse.gated_weight" in prepared.script() and Conv2dRule.prepare in _prepares()
    assert_decision_replays(tvm.IRModule({"main": prepared}), "conv2d", AVX512)
    plain = fused_kernel(lambda x, w: op.nn.conv2d(x, w), [(1, 16, 14, 14), (32, 16, 1, 1)])
    assert Conv2dRule.prepare(plain).same_as(plain)
