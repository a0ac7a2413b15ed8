"""Grouping a ResNet-50 must take under 5 s (the pass alone, on the legalized module)."""

import time

import pytest
import tvm

import tvm_ascendfuse as af
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.grouping import CostBasedFusionPass
from tvm_ascendfuse.pipeline import graph_fusion_phase, ub_fusion_phase
from tvm_ascendfuse.report import FusionReport
from tvm_ascendfuse.switches import resolve_switches
from tvm_ascendfuse.workloads import resnet50


def _legalized(model):
    npu = af.get_target("ascend910b")
    host = npu.host_target(portable=True)
    report, switches = FusionReport(), resolve_switches(None)
    with host:
        mod = tvm.transform.Sequential(graph_fusion_phase(npu, switches, report))(import_onnx(model))
        phase = ub_fusion_phase(npu, switches, report, host)
        # everything of the phase before the grouping pass: patterns, dispatch, legalize, annotate, fold
        upto = [p for p in phase if p.info.name != "CostBasedFusionPass"]
        upto = upto[: next(i for i, p in enumerate(upto) if p.info.name == "AscendFuseTIR")]
        return tvm.transform.Sequential(upto)(mod), npu


def _time_grouping(model):
    mod, npu = _legalized(model)
    t = time.perf_counter()
    out = CostBasedFusionPass(npu, FusionReport())(mod)
    return time.perf_counter() - t, out


def test_grouping_small_resnet_is_fast():
    seconds, _ = _time_grouping(resnet50(image=32, base_width=8, layers=(1, 1, 1, 1), num_classes=10))
    assert seconds < 2.0


@pytest.mark.slow
def test_grouping_resnet50_under_5s():
    seconds, _ = _time_grouping(resnet50())
    print(f"grouping ResNet-50: {seconds:.2f} s")
    assert seconds < 5.0
