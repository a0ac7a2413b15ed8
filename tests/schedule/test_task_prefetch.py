"""Per-task prefetches (schedule/task_prefetch.py): which streams a scheduled kernel gets, unchanged numbers,
and the pipeline phase behind its switch."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper
from tvm.relax import op

from tests.graph_fusion.common import onnx_model
from tests.helpers import assert_same_numbers
from tests.schedule.kernels import NATIVE, NPU, fused_kernel
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.schedule.conv import Conv2dRule
from tvm_ascendfuse.schedule.task_prefetch import insert_prefetches

RNG = np.random.default_rng(3)
# explicit hosts of both vector widths, for structure only (code built for them may not run on this machine)
AVX512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
AVX2 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"})


def residual_pointwise(x, w, b, r):
    """A bottleneck's last 1x1 conv: + bias + residual + ReLU."""
    return op.nn.relu(op.add(op.add(op.nn.conv2d(x, w), b), r))


def pointwise_relu(x, w, b):
    return op.nn.relu(op.add(op.nn.conv2d(x, w), b))


def _scheduled(build, shapes, host=NATIVE, **options):
    sch = Conv2dRule(**options).apply(fused_kernel(build, shapes), NPU, host)
    assert sch is not None
    return sch.mod["main"]


def _same_outputs(func, prefetched):
    """Both kernels built for this host on the same random inputs: identical outputs (a prefetch is a hint)."""
    arrays = [RNG.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in func.params]
    outs = []
    for f in (func, prefetched):
        lib = tvm.compile(tvm.IRModule({"main": f}), target=NATIVE)
        args = [tvm.runtime.tensor(a.copy()) for a in arrays]
        lib["main"](*args)
        outs.append(args[-1].numpy())
    np.testing.assert_array_equal(outs[0], outs[1])


def _streams(func):
    prefetched, streams = insert_prefetches(func)
    return prefetched, {s.buffer.name: s for s in streams}


def test_weights_of_the_next_task_and_the_residual_of_its_own_epilogue():
    """A 1x1 conv + residual over a 14x14 plane runs a task per block of output channels (whole plane): each
    task prefetches the next task's weight block (256 channels x its outputs, right behind its own) and the
    residual lines its own epilogue reads (its planes of 196). AVX-512's block is 2 x 16 channels (512 and 392
    lines), AVX2's row block one 8-lane vector (1 x 7 on its 8 accumulators: 128 and 98 lines; AVX2 runs
    this conv over its flat plane, whose two reduction blocks, the pixel blocks and the leftover pixels,
    this phase does not prefetch for)."""
    shapes = [(1, 256, 14, 14), (1024, 256, 1, 1), (1, 1024, 1, 1), (1, 1024, 14, 14)]
    for host, ocb in ((AVX512, 32), (AVX2, 8)):
        func = _scheduled(residual_pointwise, shapes, host, flat_plane=False)
        _, streams = _streams(func)
        weight, residual = streams[func.params[1].name], streams[func.params[3].name]
        lines = 256 * ocb * 4 // 64, ocb * 196 * 4 // 64
        assert (weight.next_task, weight.group, weight.count, weight.step) == (True, 1, lines[0], lines[0]), host
        assert (residual.next_task, residual.count, residual.step) == (False, lines[1], lines[1]), host
        assert func.params[0].name not in streams and func.params[2].name not in streams   # shared input, bias
    func = _scheduled(residual_pointwise, shapes, flat_plane=False)
    prefetched, _ = _streams(func)
    assert prefetched.script().count("llvm.prefetch") == 2
    _same_outputs(func, prefetched)


def test_tasks_sharing_a_weight_block_prefetch_the_next_block_in_shares():
    """A 1x1 conv whose output row is one register block runs a task per (channel block, row): the tasks of
    a block's rows share its weights, and each prefetches its share of the next block's. A 7-wide row is one
    block on AVX-512 (2 x 16 channels x 7); on AVX2 it would be 1 x 7, a load per FMA, and the conv takes the
    flat plane instead. A 4-wide row is one block at both widths (2 x 16 x 4 on AVX-512, 2 x 8 x 4 on AVX2)."""
    def shapes(hw):
        return [(1, 192, hw, hw), (1152, 192, 1, 1), (1, 1152, 1, 1)]

    for host, hw, ocb in ((AVX512, 7, 32), (AVX512, 4, 32), (AVX2, 4, 16)):
        func = _scheduled(pointwise_relu, shapes(hw), host)
        weight = _streams(func)[1][func.params[1].name]
        assert (weight.next_task, weight.group, weight.count) == (True, hw, 192 * ocb * 4 // 64), (host, hw)
    func = _scheduled(pointwise_relu, shapes(4))
    prefetched, streams = _streams(func)
    weight = streams[func.params[1].name]
    assert (weight.next_task, weight.group) == (True, 4)
    _same_outputs(func, prefetched)


def test_strided_rows_are_left_to_the_hardware():
    """A 1x1 conv on a 56x56 plane reads, per task, one row of every input channel (lines 12.5 KB apart) and
    writes rows of its output channels: no stream of one contiguous run, nothing prefetched of the input."""
    func = _scheduled(pointwise_relu, [(1, 64, 56, 56), (64, 64, 1, 1), (1, 64, 1, 1)])
    _, streams = _streams(func)
    assert func.params[0].name not in streams


def _bottleneck_tail():
    inits = {"W": RNG.standard_normal((256, 64, 1, 1)).astype("float32") * 0.1,
             "B": RNG.standard_normal(256).astype("float32")}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"]), helper.make_node("Add", ["c", "r"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    # an 8x8 plane: a row block on AVX-512 and AVX2 alike (2 x 8, 2 x 4)
    return import_onnx(onnx_model(nodes, {"x": (1, 64, 8, 8), "r": (1, 256, 8, 8)}, {"y": (1, 256, 8, 8)},
                                  inits))


@pytest.mark.parametrize("state", ["on", "off"])
def test_pipeline_phase_behind_its_switch(state):
    """The phase prefetches in the built kernels (the report names the kernels and streams) with the switch
    on, nothing with it off; the numbers agree with TVM's default build either way."""
    result = assert_same_numbers(_bottleneck_tail(), switches={"TaskPrefetch": state})
    section = result.report.sections.get("task_prefetch", {})
    assert bool(section) == (state == "on"), section
    # the scheduled module the report keeps is the rules' (the prefetches are added after it)
    assert "llvm.prefetch" not in result.scheduled_module.script()
