"""fusion_result.json: exact counts for a known graph, and reasons for every match that did not fuse."""

import json

import numpy as np
import pytest

from tvm_ascendfuse import FusionReport, make_target
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.workloads import resnet_basic_block

from .helpers import compile_ours, kernel_count, run_reference, run_vm, tol
from tests.helpers import assert_close


@pytest.fixture(scope="module")
def block():
    return import_onnx(resnet_basic_block(channels=8, hw=8))


def test_counts_for_resnet_basic_block(block, tmp_path):
    result = compile_ours(block)
    data = result.report.to_dict()
    assert data["target"] == "ascend910b"
    assert data["graph_fusion"]["ConvBatchnormFusionPass"] == {"match_times": 2, "effect_times": 2,
                                                              "not_effective": []}
    assert data["ub_fusion"]["TbeConvElemwiseFusionPass"]["effect_times"] == 2
    assert kernel_count(result) == 2
    assert all(k["pattern"].startswith("ascendfuse.conv2d") for k in data["kernels"])
    result.report.write(tmp_path / "fusion_result.json")
    assert json.loads((tmp_path / "fusion_result.json").read_text())["kernels"] == data["kernels"]


def test_switched_off_records_each_match(block):
    result = compile_ours(block, switches={"ConvBatchnormFusionPass": "off", "BatchnormScaleFusionPass": "off",
                                           "TbeConvElemwiseFusionPass": "off"})
    rec = result.report.get("ConvBatchnormFusionPass")
    assert (rec.match_times, rec.effect_times) == (2, 0)
    assert [e["reason"] for e in rec.not_effective] == ["switched_off", "switched_off"]
    conv = result.report.get("TbeConvElemwiseFusionPass")
    assert conv.effect_times == 0 and conv.match_times >= 2
    assert {e["reason"] for e in conv.not_effective} == {"switched_off"}
    x = np.random.default_rng(0).standard_normal((1, 8, 8, 8)).astype("float32")
    assert_close(run_vm(result.executable, [x]), run_reference(block, [x]), **tol("float32"))


def test_ub_overflow_reports_bytes_and_falls_back(block):
    tiny = make_target("ascend910b", name="tiny-ub", ub_bytes=1024, ub_reserved_bytes=512)
    result = compile_ours(block, target=tiny)
    refusals = [e for e in result.report.get("TbeConvElemwiseFusionPass").not_effective
                if e["reason"] == "ub_overflow"]
    assert refusals, result.report.to_dict()["ub_fusion"]
    assert all(e["bytes_available"] == 512 and e["bytes_needed"] > 512 for e in refusals)
    x = np.random.default_rng(0).standard_normal((1, 8, 8, 8)).astype("float32")
    assert_close(run_vm(result.executable, [x]), run_reference(block, [x]), **tol("float32"))


def test_record_and_touch():
    r = FusionReport("t")
    r.touch("X")
    r.record("X", True)
    r.record("X", False, "check_failed", where="lv3", failed="weights not constant")
    d = r.to_dict()["other"]["X"]
    assert d == {"match_times": 2, "effect_times": 1,
                 "not_effective": [{"reason": "check_failed", "where": "lv3", "failed": "weights not constant"}]}


def test_identical_groups_count_once_each():
    """Three equal matmul+bias+relu layers share one group function; each fusion still counts."""
    from tvm_ascendfuse.workloads import mlp3

    result = compile_ours(import_onnx(mlp3(rows=2, width=32)))   # W6's rows : width, so no layers chain
    rec = result.report.get("TbeMatmulElemwiseFusionPass")
    assert (rec.match_times, rec.effect_times) == (3, 3)
    assert kernel_count(result) == 3
