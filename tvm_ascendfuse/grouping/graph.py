"""A dataflow block as the grouping sees it: nodes, edges, readers and the pattern groups they came from.

``build_graph`` makes one ``Node`` per call_tir binding, with its op kind (TVM's op pattern), its GM traffic
counted on the PrimFunc (``analysis/traffic.py``) and padded to whole 32 B blocks, and what the structure checks
need (cube op, reduction row, row operand). A call to a pattern group (a Primitive function made only of
call_tirs, from ``PatternFusionPass``) is expanded into its call_tirs; they are tied together by ``locked``
(their ``PatternGroup``'s index) and start out as one group. Any other binding is an opaque node: it keeps
its edges (it orders the block) but never fuses.

The graph is built once per block and not changed afterwards; the run's grouping state lives in the queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax, tirx

from ..analysis.traffic import ASSUMED_SYMBOLIC_DIM, KernelTraffic, count_primfunc, symbolic_bounds
from ..ir import dtype_bytes, is_call_tir
from ..kinds import OPAQUE as OPAQUE_KIND
from ..kinds import GEMM as GEMM_KIND
from ..kinds import op_kind, product_rows
from ..target import AscendTarget
from .chain import reduces_last_axis, row_operand_positions
from .conv_prologue import conv_data_position, is_concat
from .operand_cast import widening_cast
from .cost import pad_ratio

# TVM's op pattern kinds (``op_pattern`` of a legalized PrimFunc)
ELEMWISE, BROADCAST, INJECTIVE, REDUCE, OUT_EWISE, OPAQUE = 0, 1, 2, 3, 4, 8


@dataclass
class Node:
    idx: int
    var: relax.Var
    call: object | None              # the call_tir, None for bindings we never fuse
    name: str = ""
    pattern: int = OPAQUE
    args: list = field(default_factory=list)          # relax args of the call_tir (Var or constant)
    producers: list = field(default_factory=list)     # node indices feeding this one
    users: list = field(default_factory=list)         # node indices using this one
    escapes: bool = False                              # used outside the dataflow block / by non-binding code
    traffic: KernelTraffic | None = None
    in_bytes: list = field(default_factory=list)       # padded GM bytes read per arg position
    out_bytes: float = 0.0
    out_elems: int = 1
    out_dtype: int = 4
    out_dtype_name: str = "float32"   # its dtype, for the bytes it takes on chip (``target.element_bytes``)
    cube: bool = False
    int8_cube: bool = False                            # a cube op on 8-bit integer operands (int32 accumulator)
    row: int = 0                                       # reduction row (elements) of a vector reduction
    row_operand: tuple = ()                            # arg positions a cube op reads as A[.., i, k]
    conv_data: int | None = None                       # arg position of a plain conv2d's data operand
    concat: bool = False                               # a concatenate
    row_norm: bool = False                             # a vector reduction over the last axis only (norm)
    widens: bool = False                               # a 16-bit -> float32 conversion (operand_cast.py)
    kind: str = OPAQUE_KIND                            # kinds.op_kind of the PrimFunc (the rule table's letter)
    rows: tuple | None = None                          # kinds.product_rows of a GEMM op: (rows, batch)
    locked: int | None = None                          # index of the pattern group it came from
    binding: object | None = None                      # the block binding it stands for (None: inside a pattern)

    @property
    def fusable(self) -> bool:
        return self.call is not None and self.pattern != OPAQUE


@dataclass(frozen=True)
class PatternGroup:
    """A call to a pattern group's function, expanded into ``nodes`` (in binding order)."""

    nodes: list[int]
    binding: object                  # the block binding of the call (kept as is when nothing joins the group)
    name: str                        # the pattern's name (its Composite attribute)
    gv: str                          # the group function's name


@dataclass
class BlockGraph:
    """The nodes of one dataflow block and the maps between tensors and nodes."""

    nodes: list[Node]
    var_node: dict                   # relax Var -> index of the node that binds it
    readers: dict                    # relax Var -> indices of the call_tir nodes reading it, in binding order
    patterns: list[PatternGroup]
    key: str = ""                    # "<function>:<block index>": names the block across runs on one module
    # symbolic dims the function's parameters define (a decode step's cache length): in scope everywhere in
    # the block, so a group whose inputs do not carry one is passed it as a size argument
    signature_dims: tuple = ()

    def label(self, members) -> str:
        return "+".join(self.nodes[m].name or self.nodes[m].var.name for m in members)


def build_graph(block: relax.DataflowBlock, func: relax.Function, mod: tvm.IRModule, target: AscendTarget,
                assumptions: list) -> BlockGraph:
    """The block's graph. Assumptions the traffic counts made (symbolic dims) are appended to ``assumptions``
    (once each)."""
    return _Builder(func, mod, target, assumptions).build(block)


class _Builder:
    def __init__(self, func, mod, target, assumptions):
        self.mod, self.target, self.assumptions = mod, target, assumptions
        self.func = func
        self.bounds = symbolic_bounds(func)
        self.cache: dict = {}            # per PrimFunc name: traffic count, row operand, last-axis reduction

    def build(self, block) -> BlockGraph:
        nodes: list[Node] = []
        var_node: dict = {}
        patterns: list[PatternGroup] = []
        for b in block.bindings:
            v = b.value if isinstance(b, relax.VarBinding) else None
            inner = _pattern_body(v, self.mod) if v is not None else None
            if inner is not None:
                pfunc, calls = inner
                smap = _symbolic_map(pfunc.params, v.args)
                if smap:
                    # the pattern function's own symbolic dims (its "n") -> the caller's, so the call_tir
                    # output types copied into a merged group refer to vars the group's params define
                    pfunc = pfunc.bind_symbolic_vars(smap)
                    calls = list(pfunc.body.blocks[0].bindings)
                pid = len(patterns)
                remap = {pp: a for pp, a in zip(pfunc.params, v.args)}
                ids = []
                for k, ib in enumerate(calls):
                    last = k == len(calls) - 1
                    # fresh vars per call site: one pattern function may be called several times
                    var = b.var if last else relax.DataflowVar(ib.var.name, ib.var.ty)
                    remap[ib.var] = var
                    n = Node(len(nodes), var, None)
                    args = [remap.get(a, a) for a in ib.value.args[1].fields]
                    self._fill(n, ib.value, args, var)
                    n.locked = pid
                    n.binding = b if last else None
                    nodes.append(n)
                    var_node[n.var] = n.idx
                    ids.append(n.idx)
                name = str(pfunc.attrs["Composite"]) if "Composite" in pfunc.attrs else v.op.name_hint
                patterns.append(PatternGroup(ids, b, name, v.op.name_hint))
                continue
            n = Node(len(nodes), b.var, None)
            n.binding = b
            if _simple_call_tir(v, b.var):
                self._fill(n, v, list(v.args[1].fields), b.var)
            nodes.append(n)
            var_node[b.var] = n.idx
        readers: dict = {}
        for n in nodes:
            for a in n.args:
                if isinstance(a, relax.Var):
                    readers.setdefault(a, [])
                    if n.idx not in readers[a]:
                        readers[a].append(n.idx)
        # A symbolic dim bound by a match_cast in this block (Range's length, read from a tensor) is a
        # dependence too: the ops whose types use it come after the match_cast, which comes after the op that
        # computes the length. Without the edge a sibling merge put both ends in one call_tir whose output
        # type named a dim nothing had defined yet ("call_tir expects all TensorType has shape").
        sym_def: dict = {}
        by_params = {sv for p in self.func.params for sv in relax.analysis.definable_tir_vars_in_type(p.ty)}
        for n in nodes:
            if isinstance(n.binding, relax.MatchCast) and n.binding.var.same_as(n.var):
                for sv in relax.analysis.definable_tir_vars_in_type(n.binding.var.ty):
                    if sv not in by_params:
                        sym_def.setdefault(sv, n.idx)     # the first binding defines it
        # edges
        for n in nodes:
            if n.call is not None:
                used = [a for a in n.args if isinstance(a, relax.Var)]
            else:
                used = free_vars(n.binding.value) if isinstance(n.binding, relax.VarBinding) \
                    else _free_vars_binding(n.binding)
            if sym_def:
                used = used + [sym_def[sv] for sv in relax.analysis.tir_vars_in_type(n.var.ty)
                               if sv in sym_def and sym_def[sv] < n.idx]
            for u in used:
                p = u if isinstance(u, int) else var_node.get(u)
                if p is not None and p != n.idx and p not in n.producers:
                    n.producers.append(p)
                    nodes[p].users.append(n.idx)
            if not isinstance(n.var, relax.DataflowVar):
                n.escapes = True
        dims = [v for p in self.func.params for v in relax.analysis.definable_tir_vars_in_type(p.ty)]
        return BlockGraph(nodes, var_node, readers, patterns, signature_dims=tuple(dims))

    def _fill(self, n: Node, v, args, var):
        prim = self.mod[v.args[0]]
        if not isinstance(prim, tirx.PrimFunc):
            return
        bounds, target, cache = self.bounds, self.target, self.cache
        n.call = v
        n.name = v.args[0].name_hint
        n.args = args
        pat = prim.attrs["op_pattern"] if prim.attrs and "op_pattern" in prim.attrs else OPAQUE
        n.pattern = int(pat)
        key = n.name
        if key not in cache:
            cache[key] = count_primfunc(prim, key, bounds)
        n.traffic = cache[key]
        if ("kind", key) not in cache:
            cache[("kind", key)] = op_kind(prim)
        n.kind = cache[("kind", key)]
        if n.kind == GEMM_KIND:
            if ("rows", key) not in cache:
                cache[("rows", key)] = product_rows(prim)
            n.rows = cache[("rows", key)]
        n.cube = n.traffic.cube_flops > 0
        if n.cube:
            n.int8_cube = any(str(getattr(p.ty, "dtype", "")) in ("int8", "uint8") for p in prim.params)
            if ("rowop", key) not in cache:
                cache[("rowop", key)] = row_operand_positions(prim)
            n.row_operand = cache[("rowop", key)]
            if ("convdata", key) not in cache:
                cache[("convdata", key)] = conv_data_position(prim)
            n.conv_data = cache[("convdata", key)]
        n.row = n.traffic.reduce_row_elems if not n.cube else 0
        if n.pattern == INJECTIVE:
            if ("concat", key) not in cache:
                cache[("concat", key)] = is_concat(prim)
            n.concat = cache[("concat", key)]
        if n.pattern == ELEMWISE and len(args) == 1:
            if ("widens", key) not in cache:
                cache[("widens", key)] = widening_cast(prim)
            n.widens = cache[("widens", key)]
        if n.row and n.pattern in (REDUCE, OUT_EWISE):
            if ("lastaxis", key) not in cache:
                cache[("lastaxis", key)] = reduces_last_axis(prim)
            n.row_norm = cache[("lastaxis", key)]
        shape = _static_shape(var.ty, bounds)
        n.out_dtype = dtype_bytes(var.ty.dtype)
        n.out_dtype_name = str(var.ty.dtype)
        n.out_elems = 1
        for d in shape:
            n.out_elems *= d
        n.out_bytes = sum(n.traffic.write_bytes) * pad_ratio(shape, n.out_dtype, target)
        n.in_bytes = []
        for pos, a in enumerate(args):
            rb = n.traffic.read_bytes[pos] if pos < len(n.traffic.read_bytes) else 0
            n.in_bytes.append(rb * pad_ratio(_static_shape(a.ty, bounds), tensor_dtype_bytes(a), target))
        for a in n.traffic.assumptions:
            if a not in self.assumptions:
                self.assumptions.append(a)


def _simple_call_tir(v, var) -> bool:
    return (is_call_tir(v) and len(v.args) == 2 and isinstance(v.args[1], relax.Tuple)
            and hasattr(var.ty, "dtype") and getattr(var.ty, "shape", None) is not None
            and all(isinstance(a, (relax.Var, tvm.ir.GenericConst)) for a in v.args[1].fields))


def _pattern_body(v, mod):
    """(function, call_tir bindings) of a call to a Primitive group made only of call_tirs, else None."""
    if not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.GlobalVar)):
        return None
    try:
        f = mod[v.op]
    except Exception:   # not in this module
        return None
    if not (isinstance(f, relax.Function) and f.attrs and "Primitive" in f.attrs
            and isinstance(f.body, relax.SeqExpr) and len(f.body.blocks) == 1):
        return None
    calls = list(f.body.blocks[0].bindings)
    if not calls or not all(isinstance(ib, relax.VarBinding) and _simple_call_tir(ib.value, ib.var)
                            and isinstance(mod[ib.value.args[0]], tirx.PrimFunc) for ib in calls):
        return None
    if not (isinstance(f.body.body, relax.Var) and f.body.body.same_as(calls[-1].var)):
        return None
    inner = {ib.var for ib in calls}
    params = set(f.params)
    for ib in calls:
        if not all(isinstance(a, tvm.ir.GenericConst) or a in inner or a in params for a in ib.value.args[1].fields):
            return None
    return f, calls


def tensor_elems(expr) -> int:
    """Elements of a tensor-typed expression (symbolic dims at ``ASSUMED_SYMBOLIC_DIM``)."""
    shape = getattr(expr.ty, "shape", None)
    n = 1
    for d in shape or []:
        n *= int(d.value) if hasattr(d, "value") else ASSUMED_SYMBOLIC_DIM
    return n


def tensor_dtype_bytes(expr) -> int:
    return dtype_bytes(getattr(expr.ty, "dtype", "float32"))


def _static_shape(ty, bounds) -> list[int]:
    out = []
    for d in getattr(ty, "shape", None) or []:
        if hasattr(d, "value"):
            out.append(int(d.value))
        else:
            name = getattr(d, "name", None)
            out.append(int(bounds.get(name, ASSUMED_SYMBOLIC_DIM)))
    return out


def _symbolic_map(params, args) -> dict:
    """tirx.Var dims of a callee's params -> the matching dims of the call's arguments (when different)."""
    smap = {}
    for p, a in zip(params, args):
        pshape, ashape = getattr(p.ty, "shape", None), getattr(a.ty, "shape", None)
        pvals, avals = getattr(pshape, "values", None), getattr(ashape, "values", None)
        if pvals is None or avals is None or len(pvals) != len(avals):
            continue
        for pd, ad in zip(pvals, avals):
            if isinstance(pd, tirx.Var) and pd not in smap and not pd.same_as(ad):
                smap[pd] = ad
    return smap


def free_vars(expr) -> list:
    """Every relax Var an expression refers to (post order, with repeats)."""
    found = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
    return found


def _free_vars_binding(b) -> list:
    return free_vars(b.value) if hasattr(b, "value") else []
