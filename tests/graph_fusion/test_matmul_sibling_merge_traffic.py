"""Merged Q/K/V projections (MatMulSiblingMergeFusionPass + norm prologue + attention head-split prologue) in
the whole pipeline on small BERT/LLaMA layers: same numbers, no more launches, fewer counted GM bytes, and
the grouping's cost model within 10% of the count on every kernel."""

import pytest
import tvm
from tvm import relax

from tests.helpers import assert_same_numbers, kernel_count
from tvm_ascendfuse.analysis.traffic import count_primfunc
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.grouping import GroupingConfig, PatternFusionPass
from tvm_ascendfuse.grouping.graph import build_graph
from tvm_ascendfuse.grouping.model import FusionModel
from tvm_ascendfuse.pipeline import graph_fusion_phase
from tvm_ascendfuse.report import FusionReport
from tvm_ascendfuse.switches import resolve_switches
from tvm_ascendfuse.target import get_target
from tvm_ascendfuse.workloads import bert_layer, llama_block

OFF = {"MatMulSiblingMergeFusionPass": "off"}
SEQ, HID, HEADS = 16, 64, 4
BUILDERS = {"bert": lambda: bert_layer(seq=SEQ, hidden=HID, heads=HEADS, ffn=128),
            "llama": lambda: llama_block(seq=SEQ, hidden=HID, heads=HEADS, ffn=96)}


def _prims(mod):
    return {g.name_hint: f for g, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}


def _modeled_bytes_per_kernel(result) -> dict:
    """The grouping model's dense GM bytes of every pattern group (the kernels the grouping left as they
    were), rebuilt from the module that entered UB fusion."""
    target = get_target("ascend910b")
    mod = PatternFusionPass(target, FusionReport(), resolve_switches(None))(result.graph_fused)
    mod = relax.transform.FoldConstant()(relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod)))
    func = mod["main"]
    [block] = [b for b in func.body.blocks if isinstance(b, relax.DataflowBlock)]
    graph = build_graph(block, func, mod, target, [])
    model = FusionModel(graph, target, GroupingConfig())
    out = {}
    for pat in graph.patterns:
        members = pat.nodes
        outs = model.outputs(members, lambda _: None)
        cost, _ = model.cost(members, outs, model.inputs(members))
        out[pat.name] = cost.dense_bytes
    return out


def _compile(name, switches=None):
    mod = import_onnx(BUILDERS[name]())
    result = assert_same_numbers(mod, switches=switches)
    # the module as graph fusion left it, to rebuild the grouping model's view of the kernels
    target = get_target("ascend910b")
    result.graph_fused = tvm.transform.Sequential(
        graph_fusion_phase(target, resolve_switches(switches), FusionReport()))(mod)
    return result


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_merged_projection_saves_bytes_and_launches(name):
    # the attention kernel alone (not merged with its output projection), whose bytes the model must match
    alone = {"AttentionProjectionFusionPass": "off"}
    on, off = _compile(name, alone), _compile(name, {**OFF, **alone})
    assert on.report.get("MatMulSiblingMergeFusionPass").effect_times == 1
    assert kernel_count(on) <= kernel_count(off) - 2            # the Q/K/V kernels became one
    t_on, t_off = on.report.sections["traffic"]["ours"], off.report.sections["traffic"]["ours"]
    assert t_on["gm_bytes"] < t_off["gm_bytes"]
    prims = _prims(on.fused_module)
    kernels = {k["pattern"]: k for k in on.report.kernels}
    proj_pattern = "ascendfuse.norm.rms_norm_matmul" if name == "llama" else "ascendfuse.matmul.bias"
    attention = next(p for p in kernels if p and p.startswith("ascendfuse.attention."))
    # the projection kernel reads x once: x, the merged weight (and norm weight / bias), writes Q|K|V once
    proj = count_primfunc(prims[_fused_name(on, proj_pattern)])
    x, w, qkv = SEQ * HID * 4, HID * 3 * HID * 4, SEQ * 3 * HID * 4
    extra = HID * 4 if name == "llama" else 3 * HID * 4          # RMSNorm weight / merged bias
    assert proj.gm_bytes == x + w + qkv + extra
    # the attention kernel reads Q|K|V once (no per-part copies written by a second kernel)
    att = count_primfunc(prims[_fused_name(on, attention)])
    assert max(att.read_bytes) == qkv
    modeled = _modeled_bytes_per_kernel(on)
    for pattern, fn in ((proj_pattern, proj), (attention, att)):
        assert abs(modeled[pattern] - fn.gm_bytes) <= 0.10 * fn.gm_bytes, (pattern, modeled[pattern], fn.gm_bytes)


def _fused_name(result, pattern):
    """The fused_module name of the kernel made by ``pattern`` (kernel names gain suffixes when scheduled)."""
    names = [k["name"] for k in result.report.kernels if k["pattern"] == pattern]
    assert len(names) == 1, result.report.kernels
    prims = _prims(result.fused_module)
    hits = [p for p in prims if names[0].startswith(p)]
    return max(hits, key=len)
