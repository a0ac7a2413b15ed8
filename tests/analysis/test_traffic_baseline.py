"""The TVM-default traffic baseline is opt-in and has one definition: counted on the module as imported.

The pipeline's table (``compile_model(..., traffic_baseline=True)``) and the benchmark's (``traffic_table`` on
the import, ``benchmarks/fusion_traffic.py``) must give the same TVM-default and lower-bound rows, also on a
model with an unfolded BatchNorm, where counting after graph fusion (BN folded) would give fewer bytes.
"""

from tests.helpers import compile_ours
from tvm_ascendfuse.analysis.traffic import lower_bound
from tvm_ascendfuse.analysis.traffic_pass import BASELINE_INPUT, baseline_rows, traffic_table
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.workloads import conv_bn_relu


def _mod():
    return import_onnx(conv_bn_relu(in_channels=8, out_channels=16, hw=12))


def test_plain_compile_skips_the_baseline_but_counts_our_kernels():
    traffic = compile_ours(_mod()).report.sections["traffic"]
    assert "tvm_default" not in traffic and "lower_bound" not in traffic
    assert traffic["ours"]["launches"] == 1 and traffic["ours"]["gm_bytes"] > 0


def test_pipeline_baseline_is_the_benchmark_baseline_on_the_import():
    mod = _mod()
    result = compile_ours(mod, traffic_baseline=True)
    traffic = result.report.sections["traffic"]
    assert traffic["baseline_input"] == BASELINE_INPUT
    bench = traffic_table(mod, result.fused_module, result.target, result.host_target)
    assert traffic["tvm_default"] == bench["tvm_default"]
    assert traffic["lower_bound"] == bench["lower_bound"] == lower_bound(mod, result.target)
    assert traffic["ours"] == bench["ours"]
    # TVM default keeps the BN as its own kernel(s) on the import: more launches than our single kernel
    assert traffic["tvm_default"]["launches"] > traffic["ours"]["launches"] == 1
    assert traffic["gm_bytes_vs_lower_bound"] == bench["gm_bytes_vs_lower_bound"]


def test_baseline_rows_differ_from_counting_after_bn_folding():
    """Guards the definition: the baseline of the import counts the BN parameters and the unfolded BN."""
    from tvm_ascendfuse.pipeline import graph_fusion_phase
    from tvm_ascendfuse.report import FusionReport
    from tvm_ascendfuse.switches import resolve_switches
    import tvm
    import tvm_ascendfuse as af

    mod = _mod()
    npu = af.get_target("ascend910b")
    host = npu.host_target(portable=True)
    with host:
        folded = tvm.transform.Sequential(graph_fusion_phase(npu, resolve_switches(None), FusionReport()))(mod)
    raw, after = baseline_rows(mod, npu, host), baseline_rows(folded, npu, host)
    assert raw["lower_bound"]["gm_bytes"] > after["lower_bound"]["gm_bytes"]
    traffic = compile_ours(mod, traffic_baseline=True).report.sections["traffic"]
    assert traffic["lower_bound"] == raw["lower_bound"]
