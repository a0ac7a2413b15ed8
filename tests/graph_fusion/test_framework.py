"""GraphRewritePass machinery: a failing matcher is recorded and the graph left alone; products flatten
only through single-use values."""

import tvm
from tvm import relax

from tests.graph_fusion.common import build, run_pass
from tvm_ascendfuse.graph_fusion._graph import FunctionGraph, flatten_product


def swish_module():
    return build(lambda bb, x: relax.op.multiply(x, bb.emit(relax.op.sigmoid(x))), (2, 4))


def test_matcher_error_is_recorded_not_raised(monkeypatch):
    from tvm_ascendfuse.graph_fusion import swish

    def broken(self, var, graph):
        if graph.call(var, "relax.multiply") is not None:
            raise ZeroDivisionError("boom")
        return None

    monkeypatch.setattr(swish.SwishFusionPass, "match", broken)
    mod = swish_module()
    out, rec = run_pass(swish.SwishFusionPass, mod)
    assert rec.match_times == 1 and rec.effect_times == 0
    assert "matcher error ZeroDivisionError: boom" in rec.not_effective[0]["failed"]
    tvm.ir.assert_structural_equal(out, mod)


def test_flatten_product_opens_only_single_use_values():
    def body(bb, x):
        shared = bb.emit(relax.op.multiply(x, x))                       # used twice: stays an atom
        t = bb.emit(relax.op.divide(bb.emit(relax.op.multiply(shared, relax.const(3.0))), bb.emit(relax.op.sqrt(x))))
        return relax.op.add(t, shared)
    mod = build(body, (2, 4))
    func = relax.analysis.remove_all_unused(mod["main"])
    graph = FunctionGraph(func)
    t_var = next(v for v in graph.order if graph.call(v, "relax.divide") is not None)
    prod = flatten_product(graph, t_var, root=True)
    shared = next(v for v in graph.order if graph.call(v, "relax.multiply") is not None)   # the first multiply
    assert prod.coef == 3.0
    assert prod.atoms == {shared: 1.0, ("sqrt", func.params[0]): -1.0}


def test_no_graph_fusion_pass_imports_grouping():
    """Graph fusion sits below the UB-fusion layers: switch names come from ``switches``, options by
    constructor, so no pass imports ``grouping`` (or anything above it)."""
    import ast
    from pathlib import Path

    import tvm_ascendfuse.graph_fusion as gf

    above = ("grouping", "schedule", "pipeline", "api", "cli")
    for path in Path(gf.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2 and node.module:
                assert node.module.split(".")[0] not in above, (path.name, node.module)
            elif isinstance(node, ast.ImportFrom) and node.module:
                assert not any(node.module.startswith(f"tvm_ascendfuse.{m}") for m in above), (path.name, node.module)
