"""The grouping keeps an int8 GEMM's kernel to what the int8 rule schedules: the GEMM, the ops computing its
operands and epilogue, no reduction behind it and nothing beside it (a second output)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tests.grouping.util import group, legalize, _run
from tests.helpers import assert_close
from tvm_ascendfuse.kinds import func_blocks, is_reduction_block


def _module(norm: bool):
    """Two int8 GEMMs of one uint8 input, each dequantized by the same run-time scale (as BERT's K and V
    projections after DynamicQuantMatMulFusionPass); ``norm``: a LayerNorm behind the first."""
    rng = np.random.default_rng(0)
    widths = (64, 48)        # apart: one kernel each (equal shapes would share one PrimFunc)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 64), "uint8"))
    s = relax.Var("s", relax.TensorType((), "float32"))
    with bb.function("main", [x, s]):
        with bb.dataflow():
            outs = []
            for n in widths:
                w = relax.const(rng.integers(-128, 128, (64, n)).astype("int8"))
                bias = relax.const(rng.standard_normal(n).astype("float32"))
                acc = bb.emit(relax.op.matmul(x, w, out_dtype="int32"))
                outs.append(bb.emit(relax.op.add(relax.op.multiply(relax.op.astype(acc, "float32"), s), bias)))
            if norm:
                gamma = relax.const(np.ones(64, "float32"))
                outs[0] = bb.emit(relax.op.nn.layer_norm(outs[0], gamma, relax.const(np.zeros(64, "float32")),
                                                         axes=[-1]))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


def _int8_kernels(fused):
    """(reduction blocks besides the GEMM, outputs) of each kernel that reads a uint8 buffer."""
    rows = []
    for gv, f in fused.functions.items():
        if not isinstance(f, tvm.tirx.PrimFunc) or not any(str(getattr(p.ty, "dtype", "")) == "uint8"
                                                             for p in f.params):
            continue
        reduces = [b for b in func_blocks(f) if is_reduction_block(b)]
        rows.append((gv.name_hint, len(reduces), len(f.params)))
    return rows


def _check(norm: bool):
    mod = _module(norm)
    fused, report, _ = group(mod)
    kernels = _int8_kernels(fused)
    assert len(kernels) == 2, kernels
    for name, reduces, n_params in kernels:
        # x, the weight, the scale, the bias, one output (a second output: a neighbour's epilogue merged in)
        assert reduces == 1 and n_params <= 5, (name, reduces, n_params)
    rng = np.random.default_rng(1)
    inputs = [rng.integers(0, 256, (1, 32, 64)).astype("uint8"), np.array(0.01, "float32")]
    for a, b in zip(_run(fused, inputs), _run(legalize(mod), inputs)):
        assert_close(a.numpy() if hasattr(a, "numpy") else a, b.numpy() if hasattr(b, "numpy") else b,
                     atol=1e-5)


def test_sibling_epilogues_are_not_merged_into_one_int8_kernel():
    _check(norm=False)


def test_layer_norm_stays_out_of_the_int8_kernel():
    _check(norm=True)


def test_structure_refuses_ops_beside_an_int8_gemm():
    """Asked directly (the cost model decides whether such a merge is ever proposed; BERT-base's K and V
    projections were): the first GEMM with its epilogue is one kernel, adding the second GEMM's epilogue is
    refused, with the reason."""
    from tvm_ascendfuse.grouping import GroupingConfig
    from tvm_ascendfuse.grouping.graph import build_graph
    from tvm_ascendfuse.grouping.model import FusionModel
    from tvm_ascendfuse.target import get_target

    mod = legalize(_module(norm=False))
    func = mod["main"]
    [block] = [b for b in func.body.blocks if isinstance(b, relax.DataflowBlock)]
    target = get_target("ascend910b")
    graph = build_graph(block, func, mod, target, [])
    model = FusionModel(graph, target, GroupingConfig())
    cubes = [n.idx for n in graph.nodes if n.int8_cube]
    assert len(cubes) == 2

    def epilogue(c):
        seen, stack = [], [c]
        while stack:
            for u in graph.nodes[stack.pop()].users:
                if u not in seen and graph.nodes[u].fusable and not graph.nodes[u].cube:
                    seen.append(u)
                    stack.append(u)
        return seen

    first, second = cubes
    assert model.structure([first, *epilogue(first)]) is None
    assert model.structure([first, *epilogue(first), *epilogue(second)]) == \
        "ops beside an int8 cube op (not its operand or epilogue)"
