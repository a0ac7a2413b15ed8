"""onnxruntime's time for the ops one of our kernels computes: the kernel's call matched to a subgraph of the
original ONNX model by the *values* of its tensors, that subgraph timed alone in onnxruntime.

TVM's ONNX importer keeps no ONNX names (its Relax variables are ``lv``, ``lv1``, ...), and our graph fusion
rewrites ops (BatchNorm folded into conv weights, decomposed GELU/LayerNorm recognised as one op), so a
kernel cannot be traced to ONNX nodes by name or by op type. What survives is the numbers: for one call of
the kernel (its arguments copied after it ran),

1. every intermediate tensor of the ONNX model is computed by onnxruntime (graph optimisations off, all node
   outputs made graph outputs) on the same model inputs;
2. each kernel output is matched to the *earliest* ONNX tensor (in the graph's node order) with the same
   number of elements and the same values (``close``: max|a - b| <= 1e-3 max|b|, compared flattened,
   so a reshape matches and a transpose does not); each non-constant kernel input to the *latest* such tensor
   that is an ancestor of the matched outputs (or to a model input);
3. the subgraph is every node on a path from those inputs to those outputs (walking back from the outputs,
   stopping at the matched inputs, initializers and model inputs); it becomes a model of its own with the
   same opsets, its inputs fed the captured values;
4. that model runs in onnxruntime with the benchmark's session options (all graph optimisations, 2 intra-op
   threads) and its own profiler: the figure is the sum over its nodes of each node's minimum kernel time
   over the runs (session overhead excluded, as our kernel times exclude the VM's), and the session's
   wall-clock minimum is kept too.

Limits: a kernel whose output (or a non-constant input) has no ONNX tensor with equal values stays
unmatched (a transposed or packed layout, a tensor that graph fusion created, e.g. a concat part after
split fusion, or values the tolerance cannot tell apart from another tensor's); constant inputs (weights,
folded constants) are never matched, so nodes that compute them in the ONNX graph from a model input
(masks and positions from the ids' shape) are walked back to that input and timed too (listed in the row's
ops); a (nearly) constant tensor is refused (it would match any other of its size), and tensors of equal
values (a copy, a reshape) may match the twin: the earliest for outputs, the latest for inputs. Only tensors
computed from a model input are candidates. A subgraph with more Conv/MatMul nodes than the kernel has
convolutions/products (x3: merged sibling projections) is refused by ``profile_kernels.same_ops_summary``
(an input matched a twin upstream). Each row says what it matched.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper

ORT_THREADS = 2
CLOSE_RTOL = 1e-3
CLOSE_ATOL = 1e-12


def close(a: np.ndarray, b: np.ndarray) -> bool:
    if a.size != b.size:
        return False
    a = a.reshape(-1)
    b = b.reshape(-1)
    if a.dtype.kind != b.dtype.kind and not (a.dtype.kind in "fc" and b.dtype.kind in "fc"):
        return False
    if a.dtype.kind in "iub":
        return bool(np.array_equal(a, b))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    scale = float(np.max(np.abs(b64))) if b64.size else 0.0
    # cheap reject on a sample first: most candidates of the right size differ at the first elements
    idx = np.linspace(0, a.size - 1, num=min(64, a.size)).astype(np.int64)
    tol = CLOSE_RTOL * scale + CLOSE_ATOL
    if float(np.max(np.abs(a64[idx] - b64[idx]))) > tol:
        return False
    return float(np.max(np.abs(a64 - b64))) <= tol


def session_options(profile_prefix: str | None = None, optimize: bool = True):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.intra_op_num_threads = ORT_THREADS
    so.log_severity_level = 3
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


class OnnxValues:
    """Every node output of ``model`` on ``feeds`` (onnxruntime, no graph optimisation), kept only for the
    element counts in ``sizes``; node order, producers and the ancestry needed for matching."""

    def __init__(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray], sizes: set[int]):
        import onnxruntime as ort

        self.model = model
        g = model.graph
        self.inits = {i.name for i in g.initializer}
        self.graph_inputs = [i.name for i in g.input if i.name not in self.inits]
        self.producer: dict[str, int] = {}
        for k, node in enumerate(g.node):
            for o in node.output:
                if o:
                    self.producer[o] = k
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        present = {o.name for o in probe.graph.output}
        const_nodes = {k for k, n in enumerate(g.node) if n.op_type == "Constant"}
        names = [o for k, n in enumerate(g.node) if k not in const_nodes for o in n.output if o and o not in present]
        probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
        sess = ort.InferenceSession(probe.SerializeToString(), session_options(optimize=False),
                                    providers=["CPUExecutionProvider"])
        out_names = [o.name for o in sess.get_outputs()]
        # only tensors computed from a model input: the rest are constants (weights, shapes), which no
        # kernel input or output that we match stands for
        live = set(self.graph_inputs)
        for node in g.node:
            if any(i in live for i in node.input) or any(_outer_names(a.g) for a in node.attribute
                                                         if a.type == onnx.AttributeProto.GRAPH):
                live.update(o for o in node.output if o)
        self.values: dict[str, np.ndarray] = {}
        for name, val in zip(out_names, sess.run(None, feeds)):
            val = np.asarray(val)
            if val.size in sizes and name in live:
                self.values[name] = val
        for name in self.graph_inputs:
            if name in feeds and feeds[name].size in sizes:
                self.values[name] = feeds[name]
        self.feeds = feeds
        self.by_size: dict[int, list[str]] = defaultdict(list)
        for name, val in self.values.items():
            self.by_size[val.size].append(name)
        for lst in self.by_size.values():
            lst.sort(key=self.order)

    def order(self, name: str) -> int:
        return self.producer.get(name, -1)     # model inputs come first

    def candidates(self, arr: np.ndarray) -> list[str]:
        return [n for n in self.by_size.get(arr.size, []) if close(arr, self.values[n])]

    def ancestors(self, outputs: list[str]) -> set[str]:
        """Tensor names the outputs depend on (through any path), the outputs included."""
        seen, stack = set(), list(outputs)
        g = self.model.graph
        while stack:
            t = stack.pop()
            if t in seen:
                continue
            seen.add(t)
            k = self.producer.get(t)
            if k is not None:
                stack.extend(i for i in g.node[k].input if i)
        return seen

    def subgraph_nodes(self, inputs: list[str], outputs: list[str]) -> list[int]:
        stop = set(inputs) | self.inits
        nodes, seen, stack = set(), set(), list(outputs)
        g = self.model.graph
        while stack:
            t = stack.pop()
            if t in seen or t in stop:
                continue
            seen.add(t)
            k = self.producer.get(t)
            if k is None:
                continue
            nodes.add(k)
            stack.extend(i for i in g.node[k].input if i)
            for attr in g.node[k].attribute:     # names an If/Loop body reads from the outer graph
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    stack.extend(_outer_names(sub))
        return sorted(nodes)


def _outer_names(graph: onnx.GraphProto) -> list[str]:
    local = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    local |= {o for n in graph.node for o in n.output}
    return [i for n in graph.node for i in n.input if i and i not in local]


def degenerate(arr: np.ndarray) -> bool:
    """All elements (nearly) equal: such a tensor matches every other one of its size and value."""
    if arr.size <= 1 or arr.dtype.kind not in "fc":
        return arr.size > 1 and bool(np.all(arr.reshape(-1) == arr.reshape(-1)[0]))
    a = arr.astype(np.float64).reshape(-1)
    return float(np.max(a) - np.min(a)) <= CLOSE_RTOL * float(np.max(np.abs(a))) + CLOSE_ATOL


def match_call(values: OnnxValues, ins: list[np.ndarray], outs: list[np.ndarray]) -> dict:
    """Match one call: {'inputs': [names], 'outputs': [names]} or {'unmatched': reason}."""
    for part, arrays in (("output", outs), ("input", ins)):
        for k, arr in enumerate(arrays):
            if degenerate(arr):
                return {"unmatched": f"{part} {k} {tuple(arr.shape)} is (nearly) constant: it cannot be told "
                                     f"apart from other tensors by its values"}
    out_names = []
    for k, arr in enumerate(outs):
        cands = values.candidates(arr)
        if not cands:
            return {"unmatched": f"output {k} {tuple(arr.shape)} has no ONNX tensor with its values"}
        out_names.append(cands[0])
    anc = values.ancestors(out_names)
    in_names = []
    for k, arr in enumerate(ins):
        cands = [n for n in values.candidates(arr) if n in anc and n not in out_names]
        if not cands:
            return {"unmatched": f"input {k} {tuple(arr.shape)} has no ONNX tensor with its values upstream "
                                 f"of the output"}
        name = max(cands, key=values.order)
        if name not in in_names:
            in_names.append(name)
    return {"inputs": in_names, "outputs": out_names}


def extract(values: OnnxValues, inputs: list[str], outputs: list[str]) -> tuple[onnx.ModelProto, dict, list[str]]:
    """(model of the subgraph, its feeds, its node op types)."""
    m = values.model
    idx = values.subgraph_nodes(inputs, outputs)
    nodes = [m.graph.node[k] for k in idx]
    used = {i for n in nodes for i in n.input if i}
    for n in nodes:
        for attr in n.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                used |= set(_outer_names(sub))
    produced = {o for n in nodes for o in n.output}
    feeds = {}
    graph_inputs = []
    for name in list(inputs) + [i for i in values.graph_inputs if i in used and i not in produced and i not in inputs]:
        arr = values.values.get(name, values.feeds.get(name))
        feeds[name] = arr
        graph_inputs.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
    graph_outputs = [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(values.values[n].dtype), list(values.values[n].shape)) for n in outputs]
    inits = [i for i in m.graph.initializer if i.name in used]
    g = helper.make_graph(nodes, "kernel_ops", graph_inputs, graph_outputs, initializer=inits)
    sub = helper.make_model(g, opset_imports=list(m.opset_import), ir_version=m.ir_version)
    sub.functions.extend(m.functions)
    return sub, feeds, [n.op_type for n in nodes]


def time_subgraph(model: onnx.ModelProto, feeds: dict, runs: int = 20) -> dict:
    """ORT's node-kernel time (sum of per-node minima over ``runs``) and session wall-clock min, ms."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = session_options(os.path.join(tmp, "ort"))
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
        wall = float("inf")
        for _ in range(runs):
            t = time.perf_counter()
            sess.run(None, feeds)
            wall = min(wall, time.perf_counter() - t)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    per_node: dict[str, float] = {}
    ops: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        per_node[e["name"]] = min(per_node.get(e["name"], float("inf")), e["dur"] / 1e3)
        ops[e["name"]] = e.get("args", {}).get("op_name", "?")
    return {"node_ms": sum(per_node.values()), "wall_ms": wall * 1e3,
            "ort_nodes": sorted(set(ops.values()))}


def ort_same_ops(model: onnx.ModelProto, feeds: dict[str, np.ndarray], calls: list[dict], runs: int = 20,
                 log=None) -> list[dict]:
    """For each captured call {'kernel', 'inputs': [arrays], 'outputs': [arrays]} (constant inputs left
    out): the match, the subgraph's ONNX ops and onnxruntime's time. One dict per call, same order."""
    sizes = {a.size for c in calls for a in c["inputs"] + c["outputs"]}
    values = OnnxValues(model, feeds, sizes)
    rows = []
    for c in calls:
        row = {"kernel": c["kernel"]}
        m = match_call(values, c["inputs"], c["outputs"])
        if "unmatched" in m:
            row["unmatched"] = m["unmatched"]
        else:
            try:
                sub, sub_feeds, ops = extract(values, m["inputs"], m["outputs"])
                row.update(onnx_inputs=m["inputs"], onnx_outputs=m["outputs"], onnx_ops=ops,
                           **time_subgraph(sub, sub_feeds, runs))
            except Exception as err:  # noqa: BLE001 - a subgraph ORT cannot run is reported, not fatal
                row["unmatched"] = f"subgraph failed in onnxruntime: {type(err).__name__}: " \
                                   f"{str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}"
        if log:
            log(f"  ORT same ops {c['kernel']}: "
                f"{row.get('unmatched') or '%.3f ms (%s)' % (row['node_ms'], '+'.join(row['onnx_ops'])[:80])}")
        rows.append(row)
    return rows
