"""The grouping pass inside the ascendfuse pipeline on small workloads: numbers, launches, traffic table."""


from tests.helpers import assert_same_numbers, kernel_count
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.workloads import bert_layer, llama_block, resnet_basic_block

OFF = {"CostBasedFusionPass": "off"}


def _check(model):
    mod = import_onnx(model)
    ours = assert_same_numbers(mod, traffic_baseline=True)
    fallback = assert_same_numbers(mod, switches=OFF)
    return ours, fallback


def test_bert_layer_small_pattern_groups_absorb_layout_and_layernorm():
    ours, fallback = _check(bert_layer(seq=16, hidden=64, heads=4, ffn=128))
    assert kernel_count(ours) <= 8 and kernel_count(ours) < kernel_count(fallback)
    assert ours.report.get("CostBasedFusionPass").effect_times > 0
    t = ours.report.sections["traffic"]
    assert t["ours"]["launches"] == kernel_count(ours)
    assert t["ours"]["modeled_time_us"] <= t["tvm_default"]["modeled_time_us"]
    assert t["lower_bound"]["gm_bytes"] <= t["ours"]["gm_bytes"]
    _model_within_10_percent_of_count(ours)


def _model_within_10_percent_of_count(result):
    """Modeled GM bytes of each emitted group vs the bytes counted on the PrimFunc FuseTIR made of it."""
    import tvm
    from tvm_ascendfuse.analysis.traffic import count_primfunc

    prims = {g.name_hint: f for g, f in result.fused_module.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    rows = result.report.sections["grouping"]["groups"]
    assert rows
    for r in rows:
        counted = count_primfunc(prims[r["name"]]).gm_bytes
        assert abs(r["modeled_gm_bytes"] - counted) <= 0.10 * counted, (r["name"], r["modeled_gm_bytes"], counted)


def test_llama_block_small():
    ours, fallback = _check(llama_block(seq=16, hidden=64, heads=4, ffn=96))
    assert kernel_count(ours) <= kernel_count(fallback)
    _model_within_10_percent_of_count(ours)
    t = ours.report.sections["traffic"]
    assert t["ours"]["modeled_time_us"] <= t["tvm_default"]["modeled_time_us"]


def test_resnet_basic_block_small():
    ours, _ = _check(resnet_basic_block(channels=8, hw=8))
    assert kernel_count(ours) == 2


def test_tiny_resnet50_pool_and_head_merge_into_conv_kernels():
    from tvm_ascendfuse.workloads import resnet50
    ours = assert_same_numbers(import_onnx(resnet50(image=32, base_width=8, layers=(1, 1, 1, 1), num_classes=10)),
                               traffic_baseline=True)
    t = ours.report.sections["traffic"]
    assert ours.report.get("CostBasedFusionPass").effect_times > 0
    assert t["ours"]["launches"] < t["tvm_default"]["launches"]
    assert t["ours"]["modeled_time_us"] < t["tvm_default"]["modeled_time_us"]
