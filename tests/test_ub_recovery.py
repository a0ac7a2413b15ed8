"""A schedule over on-chip capacity never aborts a build: the schedule phase asks the rule again with smaller
tiles, else takes the next rule, and the pipeline splits a group whose kernel thereby fell to the fallback
rule; the report says what happened (``ub_overflow_recovered`` with the bytes). Rules that over-allocate on purpose
stand in for a rule whose tiles disagree with the grouping's capacity check."""

import dataclasses

import tvm_ffi
from tvm import relax, s_tir

from tests.helpers import assert_close, random_inputs, run_reference, run_vm, tol
from tvm_ascendfuse.build import build
from tvm_ascendfuse.pipeline import AscendFusePipeline
from tvm_ascendfuse.schedule.base import ScheduleRule
from tvm_ascendfuse.schedule.elementwise import ElementwiseRule
from tvm_ascendfuse.schedule.fallback import FallbackRule
from tvm_ascendfuse.schedule.matmul import MatmulRule
from tvm_ascendfuse.schedule.reduction import ReductionRule
from tvm_ascendfuse.target import get_target

NPU = get_target("ascend910b")


def _bigger(target, factor):
    return dataclasses.replace(target, ub_bytes=target.ub_bytes * factor,
                               ub_reserved_bytes=target.ub_reserved_bytes * factor, l1_bytes=target.l1_bytes * factor,
                               l0a_bytes=target.l0a_bytes * factor, l0b_bytes=target.l0b_bytes * factor,
                               l0c_bytes=target.l0c_bytes * factor)


class OversizedTiles(ScheduleRule):
    """Sizes its tiles from the target, but for twelve times its buffers (the elementwise rule counts a
    buffer per operand, of which it stages one): smaller tiles make it fit."""

    name = "oversized"

    def apply(self, func, target, host):
        return ElementwiseRule().apply(func, _bigger(target, 12), host)


class HugeTiles(ScheduleRule):
    """``inner``'s schedule with the kernel's first input staged whole in UB, whatever target it is given:
    smaller tiles cannot make it fit."""

    def __init__(self, inner, name):
        self.inner, self.name = inner, name

    def apply(self, func, target, host):
        sch = self.inner.apply(func, target, host)
        if sch is None:
            return None
        first = sch.mod["main"].params[0]
        for block in _blocks(sch.mod["main"]):
            at = [i for i, r in enumerate(block.reads) if r.source.same_as(first)]
            if at:
                sch.cache_read(sch.get_sblock(block.name_hint), at[0], "local.UB")
                return sch
        return None


def _blocks(func):
    found = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, found.append), order="pre")
    return found[1:]


def _compile(mod, rules):
    pipeline = AscendFusePipeline(NPU, rules=rules)
    ex = build(mod, NPU.host_target(portable=True), pipeline, jobs=1)
    return ex, pipeline.report


def _check(mod, ex):
    inputs = random_inputs(mod)
    assert_close(run_vm(ex, inputs), run_reference(mod, inputs), **tol("float32"))


def _module(body, shapes):
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(body(*xs))
        bb.emit_func_output(out)
    return bb.get()


def _tanh_add():
    return _module(lambda x, y: relax.op.add(relax.op.tanh(x), y), [(1024, 1024), (1024, 1024)])


def test_overflow_rescheduled_with_smaller_tiles():
    mod = _tanh_add()
    ex, report = _compile(mod, [OversizedTiles, FallbackRule])
    [record] = report.sections["ub_overflow_recovered"]
    assert record["action"] == "smaller_tiles" and record["final_rule"] == "oversized"
    assert record["needed_bytes"] > record["available_bytes"] == NPU.ub_usable
    assert record["scheduled_for_bytes"] < NPU.ub_usable
    assert [k["rule"] for k in report.kernels] == ["oversized"]
    usage = report.sections["ub_usage"]
    assert all(0 < u["ub_bytes"] <= NPU.ub_usable for u in usage.values())
    _check(mod, ex)


def test_overflow_that_smaller_tiles_cannot_fix_takes_the_next_rule():
    mod = _tanh_add()
    ex, report = _compile(mod, [HugeTiles(ElementwiseRule(), "huge"), ElementwiseRule, FallbackRule])
    [record] = report.sections["ub_overflow_recovered"]
    assert record["action"] == "next_rule" and record["rule"] == "huge" and record["final_rule"] == "elementwise"
    assert record["needed_bytes"] > record["available_bytes"]
    assert [k["rule"] for k in report.kernels] == ["elementwise"]
    _check(mod, ex)
def test_group_that_lost_its_rule_is_split_back():
    # matmul -> multiply -> tanh is grouped for the matmul rule; when that rule's schedule cannot fit, the kernel
    # would run on the fallback rule: the pipeline groups again without that group
    mod = _module(lambda x, w, b: relax.op.tanh(relax.op.multiply(relax.op.matmul(x, w), b)),
                  [(256, 256), (256, 256), (256,)])
    ex, report = _compile(mod, [HugeTiles(MatmulRule(), "matmul"), ReductionRule, ElementwiseRule, FallbackRule])
    records = report.sections["ub_overflow_recovered"]
    [split] = [r for r in records if r["action"] == "split_group"]
    assert split["needed_bytes"] > split["available_bytes"] == NPU.ub_usable
    assert split["instead_of_rule"] == "fallback" and split["ops"] == ["matmul", "multiply", "tir_tanh"]
    # the epilogue is no longer in the matmul's kernel: it runs on the rule that takes it well
    rules = {tuple(k["ops"]): k["rule"] for k in report.kernels}
    assert rules == {("matmul",): "fallback", ("multiply", "tir_tanh"): "elementwise"}
    _check(mod, ex)


def test_convnext_block_needs_no_recovery(monkeypatch):
    """A ConvNeXt stage with its LayerNorm-over-channels downsampling (transpose -> norm -> transpose back,
    grouped with the layer-scale and residual ops and the last linear layer before them), on a UB too small
    for any of its tensors: the groups the grouping makes are scheduled within UB by their own rules, so
    nothing is recovered (no split group, no fallback kernel) and the schedule phase runs once."""
    from tests.helpers import assert_same_numbers, assert_scheduled_within_capacity
    from tvm_ascendfuse.frontend import import_onnx
    from tvm_ascendfuse.schedule import apply
    from tvm_ascendfuse.workloads.cnn_blocks import convnext_block

    runs = []
    original = apply.ScheduleKernels.transform_module
    monkeypatch.setattr(apply.ScheduleKernels, "transform_module",
                        lambda self, mod: runs.append(1) or original(self, mod))
    small = dataclasses.replace(NPU, ub_reserved_bytes=NPU.ub_bytes - 16384)
    assert 24 * 14 * 14 * 4 > small.ub_usable
    result = assert_same_numbers(import_onnx(convnext_block(channels=24, hw=14, depth=1)), target=small)
    report = result.report
    assert "ub_overflow_recovered" not in report.sections, report.sections.get("ub_overflow_recovered")
    rules = [k["rule"] for k in report.kernels]
    assert "fallback" not in rules and None not in rules, rules
    # the downsampling norm (its transposes and layer_norm) is in a kernel of the norm rules
    assert any("layer_norm" in " ".join(k["ops"]) and "transpose" in " ".join(k["ops"])
               and k["rule"] in ("reduction", "matmul+norm") for k in report.kernels), report.kernels
    assert len(runs) == 1
    assert_scheduled_within_capacity(result, small)
