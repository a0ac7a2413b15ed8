"""UB fusion, part (b): cost-based grouping of the call_tirs no pattern took (replaces TVM's FuseOps).

Runs after LegalizeOps / AnnotateTIROpPattern. Every call_tir of a dataflow block starts as its own group.
Candidate merges — producer into consumer, two consumers of one tensor (siblings), and a cheap producer
duplicated into all its consumers — are scored by the modeled time they save (``cost.py``) and taken
greedily, largest gain first, from a heap. After a merge only the candidates touching the new group are
re-scored (stale heap entries are dropped by version), so the work is proportional to the graph's edges,
not quadratic. A merge is legal when the group stays convex (no path leaves it and comes back), when one
tile fits UB/L0 (``capacity.py``), when the structure is one the NPU runs as one kernel (at most one cube
op, whose consumers are elementwise/broadcast/injective; reductions take elementwise producers and, when a
row fits UB, their epilogue), and when no cap (ops, depth, parameters) is hit. Groups of two or more
call_tirs become private ``Primitive`` Relax functions, which FuseTIR turns into one PrimFunc each.

Every candidate still open at the end is recorded in the report with the reason it was not taken.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import time
import warnings
from dataclasses import dataclass, field

import tvm
from tvm import relax, tirx

from ..analysis.traffic import ASSUMED_SYMBOLIC_DIM, KernelTraffic, count_primfunc, dtype_bytes, symbolic_bounds
from ..passbase import PyPass
from ..report import CAP_HIT, CYCLE, NOT_PROFITABLE, UB_OVERFLOW, CHECK_FAILED, FusionReport
from ..switches import UB_FUSION, register_switch
from ..target import AscendTarget, current_target_from_tvm, get_target
from .capacity import TileBuffer, l0_check, ub_check
from .attention_chain import AttentionChain, find_attention_chain
from .chain import Chain, find_chain, reachable, reduces_last_axis, row_operand_positions
from .cost import GroupCost, GroupingConfig, accept, pad_ratio, tiles_for

SWITCH = register_switch(
    "CostBasedFusionPass", UB_FUSION,
    "cost-model grouping of the remaining ops into UB-fused kernels (replaces TVM FuseOps)")

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
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
    cube: bool = False
    row: int = 0                                       # reduction row (elements) of a vector reduction
    row_operand: tuple = ()                            # arg positions a cube op reads as A[.., i, k]
    row_norm: bool = False                             # a vector reduction over the last axis only (norm)
    locked: int | None = None                          # index of the pattern group it came from
    binding: object | None = None                      # the block binding it stands for (None: inside a pattern)

    @property
    def fusable(self) -> bool:
        return self.call is not None and self.pattern != OPAQUE


@dataclass
class Group:
    gid: int
    members: list                    # node indices in binding order (duplicated copies included)
    owner_of: set                    # members this group owns (not duplicated copies)
    version: int = 0
    alive: bool = True


class _Model:
    """Cost, capacity and structure of candidate groups over one dataflow block."""

    def __init__(self, nodes: list[Node], target: AscendTarget, cfg: GroupingConfig):
        self.nodes, self.target, self.cfg = nodes, target, cfg
        self._chains: dict[tuple, Chain | str | None] = {}   # cost, capacity and structure all ask per candidate

    # external inputs: key -> (bytes, elems, dtype)
    def inputs(self, members: list[int]) -> dict:
        mset = set(members)
        ins: dict = {}
        for m in members:
            n = self.nodes[m]
            for pos, a in enumerate(n.args):
                prod_idx = self.producer_of(a)
                if prod_idx is not None and prod_idx in mset:
                    continue
                b = n.in_bytes[pos] if pos < len(n.in_bytes) else 0
                dense = n.traffic.read_bytes[pos] if pos < len(n.traffic.read_bytes) else 0
                key = a
                if key in ins:
                    # several members reading one tensor: parts of it (Q/K/V slices of a merged
                    # projection) add up, whole reads do not; the tensor's size caps the sum
                    old, full = ins[key], _elems(a) * _dtype(a)
                    pad = b / dense if dense else 1.0
                    ins[key] = (min(old[0] + b, max(old[0], b, full * pad)), old[1], old[2],
                                min(old[3] + dense, max(old[3], dense, full)))
                else:
                    ins[key] = (b, _elems(a), _dtype(a), dense)
        return ins

    def producer_of(self, arg):
        return self.var_node.get(arg) if isinstance(arg, relax.Var) else None

    def outputs(self, members: list[int], group_of) -> list[int]:
        mset = set(members)
        outs = []
        for m in members:
            n = self.nodes[m]
            if n.escapes:
                outs.append(m)
                continue
            for u in n.users:
                if u in mset:
                    continue
                g = group_of(u)
                if g is None or m not in g.members:
                    outs.append(m)
                    break
        return outs

    def cost(self, members: list[int], outs: list[int], ins: dict) -> tuple[GroupCost | None, object]:
        nodes = [self.nodes[m] for m in members]
        gm = sum(v[0] for v in ins.values()) + sum(self.nodes[o].out_bytes for o in outs)
        dense = sum(v[3] for v in ins.values()) + sum(sum(self.nodes[o].traffic.write_bytes) for o in outs)
        vf = sum(n.traffic.vector_flops for n in nodes)
        cf = sum(n.traffic.cube_flops_padded for n in nodes)
        cube = any(n.cube for n in nodes)
        dt = max((n.out_dtype for n in nodes), default=4)
        check = self.capacity(members, outs, ins)
        if not check.fits:
            return None, check
        # tiles cover the largest tensor the group streams (a reduction's input, not its small output)
        out_elems = max([self.nodes[m].out_elems for m in members] + [v[1] for v in ins.values()])
        chain = self.chain(members)
        if isinstance(chain, Chain):
            # one block of rows per tile; blocks no larger than needed to give every cube core one
            rows = max(1, min(check.tile_elems, chain.rows // max(1, self.target.cube_cores)))
            tile = rows * chain.n1
            out_elems = chain.rows * chain.n1
        elif cube:
            tile = min(self.cfg.cube_tile_elems, check.tile_elems)
        elif self.resident_row(members):
            row = self.resident_row(members)
            tile = max(row, (check.tile_elems // row) * row)
        else:
            tile = check.tile_elems
        return GroupCost(gm, vf, cf, tiles_for(out_elems, tile), cube, dt, dense_bytes=dense), check

    def resident_row(self, members: list[int]) -> int:
        """Row length kept in UB: a vector reduction whose result is consumed inside the group."""
        mset = set(members)
        rows = [self.nodes[m].row for m in members
                if self.nodes[m].row and any(u in mset for u in self.nodes[m].users)]
        return max(rows, default=0)

    def chain(self, members: list[int]) -> Chain | str | None:
        """The chained GEMM these members form (two cube kernels), a reason they do not, or None (fewer)."""
        kernels = {("p", self.nodes[m].locked) if self.nodes[m].locked is not None else ("n", m)
                   for m in members if self.nodes[m].cube}
        if len(kernels) < 2:
            return None
        key = tuple(sorted(members))
        if key not in self._chains:
            cubes = [m for m in members if self.nodes[m].cube]
            found = find_attention_chain(self.nodes, set(members), cubes, self.var_node)
            if isinstance(found, AttentionChain) and not self.cfg.allow_attention_projection:
                found = "attention and its output projection in one kernel (switched off)"
            elif found is None:
                found = (find_chain(self.nodes, members, self.var_node) if self.cfg.allow_chained_gemm
                         else "two cube ops in one kernel (chained GEMMs switched off)")
            self._chains[key] = found
        return self._chains[key]

    def capacity(self, members, outs, ins):
        chain = self.chain(members)
        if isinstance(chain, Chain):
            dt = max(self.nodes[m].out_dtype for m in members)
            check = chain.capacity(dt, self.target)
            if check.fits:
                l0 = l0_check(dt, self.target)
                return check if l0.fits else l0
            return check
        bufs = [TileBuffer(v[1], v[2]) for v in ins.values()]
        bufs += [TileBuffer(self.nodes[m].out_elems, self.nodes[m].out_dtype) for m in members]
        row = self.resident_row(members)
        min_tile = row if row else max(1, self.target.ub_align // 4)
        check = ub_check(bufs, min_tile, self.target)
        if check.fits and any(self.nodes[m].cube for m in members):
            l0 = l0_check(max(self.nodes[m].out_dtype for m in members), self.target)
            if not l0.fits:
                return l0
        return check

    def undefined_dim(self, members: list[int]) -> str | None:
        """A symbolic dim of a member's type that none of the group's inputs defines, else None.

        A grouped function gets its dims from its parameters' shapes; a length computed at run time and bound
        by a match_cast (ONNX Range: ``arange(0, n)`` then ``* delta + start``) is defined by no input of a
        group that takes the arange in, and the group's call_tir would have an output of unknown shape
        ("call_tir expects all TensorType has shape"). The arange stays its own call_tir, as TVM lowers it."""
        dims = [v for m in members for v in self._dims(m)]
        if not dims:
            return None
        defined = set()
        for key in self.inputs(members):
            if isinstance(key, relax.Var):
                defined.update(relax.analysis.definable_tir_vars_in_type(key.ty))
        return next((v.name for v in dims if v not in defined), None)

    def _dims(self, m: int) -> list:
        if not hasattr(self, "_dims_cache"):
            self._dims_cache = {}
        if m not in self._dims_cache:
            self._dims_cache[m] = list(relax.analysis.tir_vars_in_type(self.nodes[m].var.ty))
        return self._dims_cache[m]

    def depth(self, members: list[int]) -> int:
        mset, d = set(members), {}
        for m in sorted(members):
            d[m] = 1 + max((d[p] for p in self.nodes[m].producers if p in mset and p in d), default=0)
        return max(d.values(), default=0)

    def structure(self, members: list[int]) -> str | None:
        """None if the NPU can run these ops as one kernel, else what breaks it.

        A pattern group's own structure is taken as given (its checks already passed); the rules apply to
        what is added to it: one cube kernel per group; only layout (injective) ops in front of a cube
        operand (the DMA into L1 does them); a reduction behind a cube op only when a row block of the
        accumulator (cube_m rows of the reduction row, fp32) fits L0C; at most ``max_reductions`` free
        reductions."""
        nodes, mset = self.nodes, set(members)
        undefined = self.undefined_dim(members)
        if undefined is not None:
            return f"dim {undefined} of a member's shape is defined by no input of the group (data-dependent)"
        cubes = [m for m in members if nodes[m].cube]
        kernels = {("p", nodes[m].locked) if nodes[m].locked is not None else ("n", m) for m in cubes}
        chain = None
        if len(kernels) > 1:
            chain = self.chain(members)
            if not isinstance(chain, Chain):
                return chain or "two cube ops in one kernel"
        for c in cubes:
            if chain is not None and c == chain.second:
                continue            # its operand is the chain's elementwise epilogue, checked by find_chain
            stack, seen = [p for p in nodes[c].producers if p in mset], set()
            while stack:
                p = stack.pop()
                if p in seen:
                    continue
                seen.add(p)
                if nodes[p].locked is not None and nodes[p].locked == nodes[c].locked:
                    continue
                if isinstance(chain, AttentionChain) and (p == chain.query or p in chain.query_path):
                    continue        # the query projection and its bias/head split, checked by the finder
                if chain is not None and p == chain.prologue:
                    # the chain's norm prologue (its normalised row block staged on chip, see chain.py);
                    # only layout ops in front of it
                    stack.extend(q for q in nodes[p].producers if q in mset)
                    continue
                if nodes[p].pattern != INJECTIVE:
                    return "compute fused into a cube op's operand"
                stack.extend(q for q in nodes[p].producers if q in mset)
        reds = [m for m in members if nodes[m].locked is None and not nodes[m].cube
                and nodes[m].pattern in (REDUCE, OUT_EWISE)]
        if len(reds) > self.cfg.max_reductions:
            return f"more than {self.cfg.max_reductions} reductions"
        if cubes and reds:
            after_cube = reachable(nodes, cubes, mset, "users")
            limit = self.target.l0c_bytes // (self.target.cube_m * 4)
            for m in reds:
                if m in after_cube and nodes[m].row > limit:
                    return "reduction after a cube op: row block exceeds L0C"
        return None


def _elems(expr) -> int:
    shape = getattr(expr.ty, "shape", None)
    n = 1
    for d in shape or []:
        n *= int(d.value) if hasattr(d, "value") else ASSUMED_SYMBOLIC_DIM
    return n


def _dtype(expr) -> int:
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


class CostBasedFusionPass(PyPass):
    """The grouping pass. ``report.sections['grouping']`` gets one row per emitted group."""

    switch_name = SWITCH

    def __init__(self, target: AscendTarget | str | None = None, report: FusionReport | None = None,
                 config: GroupingConfig | None = None):
        self._target_spec = target
        self.report = report if report is not None else FusionReport()
        self.config = config or GroupingConfig()
        self.stats: dict = {}

    def pass_name(self) -> str:
        return "CostBasedFusionPass"

    @property
    def target(self) -> AscendTarget:
        if self._target_spec is not None:
            return get_target(self._target_spec)
        return current_target_from_tvm() or get_target("ascend910b")

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        """Group; if the grouping itself fails on some construct, fall back to TVM's FuseOps (recorded)."""
        try:
            return self._transform(mod)
        except Exception as err:  # a grouping bug must not cost the user a compile
            msg = f"{type(err).__name__}: {err}"[:500]
            warnings.warn(f"CostBasedFusionPass failed, falling back to FuseOps: {msg}")
            self.report.record(SWITCH, False, CHECK_FAILED, where="module", why="internal error, FuseOps used",
                               error=msg)
            return relax.transform.FuseOps()(mod)

    def _transform(self, mod: tvm.IRModule) -> tvm.IRModule:
        self.report.touch(SWITCH)
        target = self.target
        bb = relax.BlockBuilder(mod)
        t0 = time.perf_counter()
        section = self.report.sections.setdefault("grouping", {"groups": [], "assumptions": []})
        section["config"] = dataclasses.asdict(self.config)
        section["assumed_symbolic_dim"] = ASSUMED_SYMBOLIC_DIM
        changed = False
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function) or (func.attrs and "Primitive" in func.attrs):
                continue
            if not isinstance(func.body, relax.SeqExpr):
                continue
            new_blocks = []
            for block in func.body.blocks:
                if isinstance(block, relax.DataflowBlock):
                    nb = self._group_block(block, func, mod, bb, target, section)
                    changed |= nb is not block
                    new_blocks.append(nb)
                else:
                    new_blocks.append(block)
            if changed:
                body = relax.SeqExpr(new_blocks, func.body.body)
                new_func = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
                bb.update_func(gv, new_func)
        st = section.setdefault("stats", {"merges": 0, "call_tirs": 0, "seconds": 0.0})
        st["seconds"] = round(st["seconds"] + time.perf_counter() - t0, 3)
        if not changed:
            return mod
        out = bb.get()
        return relax.transform.DeadCodeElimination()(out)

    # ---- one dataflow block ---------------------------------------------------------------------------
    def _nodes(self, block, func, mod, target) -> list[Node]:
        """One node per call_tir; a call to a pattern group (Primitive function of call_tirs) is expanded
        into its call_tirs, which start out as one locked group; anything else is an opaque node."""
        bounds = symbolic_bounds(func)
        nodes: list[Node] = []
        var_node: dict = {}
        self._cache: dict = {}
        self._patterns: list[dict] = []
        for b in block.bindings:
            v = b.value if isinstance(b, relax.VarBinding) else None
            inner = self._pattern_body(v, mod) if v is not None else None
            if inner is not None:
                pfunc, calls = inner
                smap = _symbolic_map(pfunc.params, v.args)
                if smap:
                    # the pattern function's own symbolic dims (its "n") -> the caller's, so the call_tir
                    # output types copied into a merged group refer to vars the group's params define
                    pfunc = pfunc.bind_symbolic_vars(smap)
                    calls = list(pfunc.body.blocks[0].bindings)
                pid = len(self._patterns)
                remap = {pp: a for pp, a in zip(pfunc.params, v.args)}
                ids = []
                for k, ib in enumerate(calls):
                    last = k == len(calls) - 1
                    # fresh vars per call site: one pattern function may be called several times
                    var = b.var if last else relax.DataflowVar(ib.var.name, ib.var.ty)
                    remap[ib.var] = var
                    n = Node(len(nodes), var, None)
                    args = [remap.get(a, a) for a in ib.value.args[1].fields]
                    self._fill(n, ib.value, args, var, mod, bounds, target)
                    n.locked = pid
                    n.binding = b if last else None
                    nodes.append(n)
                    var_node[n.var] = n.idx
                    ids.append(n.idx)
                name = str(pfunc.attrs["Composite"]) if "Composite" in pfunc.attrs else v.op.name_hint
                self._patterns.append({"nodes": ids, "binding": b, "name": name, "gv": v.op.name_hint})
                continue
            n = Node(len(nodes), b.var, None)
            n.binding = b
            if self._simple_call_tir(v, b.var):
                self._fill(n, v, list(v.args[1].fields), b.var, mod, bounds, target)
            nodes.append(n)
            var_node[b.var] = n.idx
        readers: dict = {}
        for n in nodes:
            for a in n.args:
                if isinstance(a, relax.Var):
                    readers.setdefault(a, [])
                    if n.idx not in readers[a]:
                        readers[a].append(n.idx)
        self._readers = readers
        # A symbolic dim bound by a match_cast in this block (Range's length, read from a tensor) is a
        # dependence too: the ops whose types use it come after the match_cast, which comes after the op that
        # computes the length. Without the edge a sibling merge put both ends in one call_tir whose output
        # type named a dim nothing had defined yet ("call_tir expects all TensorType has shape").
        sym_def: dict = {}
        by_params = {sv for p in func.params for sv in relax.analysis.definable_tir_vars_in_type(p.ty)}
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
                used = _free_vars(n.binding.value) if isinstance(n.binding, relax.VarBinding) \
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
        self._var_node = var_node
        return nodes

    @staticmethod
    def _simple_call_tir(v, var) -> bool:
        return (v is not None and isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)
                and v.op.same_as(_CALL_TIR) and len(v.args) == 2 and isinstance(v.args[1], relax.Tuple)
                and hasattr(var.ty, "dtype") and getattr(var.ty, "shape", None) is not None
                and all(isinstance(a, (relax.Var, tvm.ir.GenericConst)) for a in v.args[1].fields))

    def _pattern_body(self, v, mod):
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
        if not calls or not all(isinstance(ib, relax.VarBinding) and self._simple_call_tir(ib.value, ib.var)
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

    def _fill(self, n: Node, v, args, var, mod, bounds, target):
        prim = mod[v.args[0]]
        if not isinstance(prim, tirx.PrimFunc):
            return
        n.call = v
        n.name = v.args[0].name_hint
        n.args = args
        pat = prim.attrs["op_pattern"] if prim.attrs and "op_pattern" in prim.attrs else OPAQUE
        n.pattern = int(pat)
        key = n.name
        if key not in self._cache:
            self._cache[key] = count_primfunc(prim, key, bounds)
        n.traffic = self._cache[key]
        n.cube = n.traffic.cube_flops > 0
        if n.cube:
            if ("rowop", key) not in self._cache:
                self._cache[("rowop", key)] = row_operand_positions(prim)
            n.row_operand = self._cache[("rowop", key)]
        n.row = n.traffic.reduce_row_elems if not n.cube else 0
        if n.row and n.pattern in (REDUCE, OUT_EWISE):
            if ("lastaxis", key) not in self._cache:
                self._cache[("lastaxis", key)] = reduces_last_axis(prim)
            n.row_norm = self._cache[("lastaxis", key)]
        shape = _static_shape(var.ty, bounds)
        n.out_dtype = dtype_bytes(var.ty.dtype)
        n.out_elems = 1
        for d in shape:
            n.out_elems *= d
        n.out_bytes = sum(n.traffic.write_bytes) * pad_ratio(shape, n.out_dtype, target)
        n.in_bytes = []
        for pos, a in enumerate(args):
            rb = n.traffic.read_bytes[pos] if pos < len(n.traffic.read_bytes) else 0
            n.in_bytes.append(rb * pad_ratio(_static_shape(a.ty, bounds), _dtype(a), target))
        if n.traffic.assumptions:
            self._assume(n.traffic.assumptions)

    def _assume(self, items):
        sec = self.report.sections.setdefault("grouping", {"groups": [], "assumptions": []})
        for a in items:
            if a not in sec["assumptions"]:
                sec["assumptions"].append(a)

    def _group_block(self, block, func, mod, bb, target, section):
        cfg = self.config
        nodes = self._nodes(block, func, mod, target)
        model = _Model(nodes, target, cfg)
        model.var_node = self._var_node
        groups: dict[int, Group] = {}
        owner: dict[int, int] = {}           # node -> gid of the group that owns it
        locked = set()
        for pid, pat in enumerate(self._patterns):
            gid = len(nodes) + pid
            groups[gid] = Group(gid, list(pat["nodes"]), set(pat["nodes"]))
            for m in pat["nodes"]:
                owner[m] = gid
                locked.add(m)
        for n in nodes:
            if n.idx not in locked:
                groups[n.idx] = Group(n.idx, [n.idx], {n.idx})
                owner[n.idx] = n.idx
        next_gid = itertools.count(len(nodes) + len(self._patterns))
        group_of = lambda node_idx: groups.get(owner.get(node_idx)) if owner.get(node_idx) is not None else None
        # A duplicated node has no owner: its copies live in the groups of its users. Edges into those copies
        # are real dependences, so every graph walk must see them (else a merge that closes a cycle through
        # a copy looks convex).
        copies: dict[int, set] = {}          # duplicated node -> gids of the groups holding a copy

        def holders(node_idx) -> set:
            og = owner.get(node_idx)
            return {og} if og is not None else copies.get(node_idx, set())

        def gcost(members, copied=()):
            ins = model.inputs(members)
            outs = [o for o in model.outputs(members, group_of) if o not in copied]
            return model.cost(members, outs, ins), ins, outs

        cost_cache: dict = {}

        def cost_of(g: Group):
            key = (g.gid, g.version)
            if key not in cost_cache:
                (c, _chk), _, _ = gcost(g.members)
                cost_cache[key] = c
            return cost_cache[key]

        def producers(g: Group) -> set:
            out = set()
            for m in g.members:
                for p in nodes[m].producers:
                    og = owner.get(p)
                    if og is not None and og != g.gid and p not in g.members:
                        out.add(og)
            return out

        def consumers(g: Group) -> set:
            out = set()
            for m in g.owner_of:
                for u in nodes[m].users:
                    out |= holders(u)
            out.discard(g.gid)
            return out

        def reaches(src: Group, dst: Group, skip_direct: bool) -> bool:
            """Is there a path src -> ... -> dst through some third group?"""
            stack = [c for c in consumers(src) if c != dst.gid] if skip_direct else list(consumers(src))
            seen = set()
            while stack:
                gid = stack.pop()
                if gid in seen:
                    continue
                seen.add(gid)
                if gid == dst.gid:
                    return True
                stack.extend(consumers(groups[gid]))
            return False

        def legal(members, a: Group, b: Group | None):
            """(reason, detail) or (None, None)."""
            if any(not nodes[m].fusable for m in members):
                return CHECK_FAILED, {"why": "opaque op"}
            why = model.structure(members)
            if why:
                return CHECK_FAILED, {"why": why}
            if len(members) > cfg.max_ops:
                return CAP_HIT, {"cap": "max_ops", "ops": len(members), "limit": cfg.max_ops}
            d = model.depth(members)
            if d > cfg.max_depth:
                return CAP_HIT, {"cap": "max_depth", "depth": d, "limit": cfg.max_depth}
            if b is not None and (reaches(a, b, True) or reaches(b, a, True)):
                return CYCLE, {}
            return None, None

        def evaluate(kind, gids):
            """-> (gain, new_members, detail, reason)"""
            gs = [groups[g] for g in gids]
            if kind == "dup":
                if not self._dupable(gs[0], nodes, holders):
                    # a stale candidate: the group took a copy of another producer since it was pushed
                    return None, list(gs[0].members), {"why": "no longer a single duplicable op"}, CHECK_FAILED
                return self._eval_dup(gs[0], groups, holders, nodes, model, gcost, cost_of, group_of, target)
            a, b = gs
            members = sorted(set(a.members) | set(b.members))
            reason, detail = legal(members, a, b)
            if reason:
                return None, members, detail, reason
            (c, chk), ins, outs = gcost(members)
            if not cfg.allow_multi_output and len(outs) > 1:
                return None, members, {"why": "multi-output groups switched off"}, CHECK_FAILED
            if c is None:
                return None, members, {"needed_bytes": chk.needed_bytes, "available_bytes": chk.available_bytes,
                                       "scope": chk.scope, **({"what": chk.what} if chk.what else {})}, UB_OVERFLOW
            if len(ins) > cfg.max_params:
                return None, members, {"cap": "max_params", "params": len(ins), "limit": cfg.max_params}, CAP_HIT
            before = cost_of(a).time_us(target) + cost_of(b).time_us(target)
            after = c.time_us(target)
            detail = {"modeled_us_unfused": round(before, 4), "modeled_us_fused": round(after, 4),
                      "modeled_gain_us": round(before - after, 4)}
            if not accept(before - after, before, cfg):
                return None, members, detail, NOT_PROFITABLE
            chain = model.chain(members)
            saving = chain.saving_vs_weights() if isinstance(chain, Chain) else None
            if saving is not None and saving < cfg.chain_min_saving_vs_weights:
                # the model counts the chain's weights once, but they are streamed again for every row block
                # (from L2): chain only when the intermediate's round trip is a clear share of those weights
                detail.update(why="intermediate round trip small next to the re-streamed weights",
                              saving_vs_weights=round(saving, 4),
                              limit=cfg.chain_min_saving_vs_weights)
                return None, members, detail, NOT_PROFITABLE
            return before - after, members, detail, None

        heap: list = []
        seq = itertools.count()

        def push(kind, gids):
            gids = tuple(gids)
            gain, _, _, reason = evaluate(kind, gids)
            if reason is None:
                vers = tuple(groups[g].version for g in gids)
                # gains equal up to float rounding (one saved round trip of the same tensor, reached by
                # different sums) are ties, taken in push order: producer-side merges first
                heapq.heappush(heap, (-round(gain, 6), next(seq), kind, gids, vers))

        def candidates_of(g: Group):
            out = []
            for p in producers(g):
                out.append(("pc", (p, g.gid)))
            for c in consumers(g):
                out.append(("pc", (g.gid, c)))
            if cfg.allow_siblings:
                for key in model.inputs(g.members):
                    if isinstance(key, relax.Var):
                        readers = self._readers.get(key, [])
                        sib = []
                        for r in readers:
                            og = owner.get(r)
                            if og is not None and og != g.gid and og not in sib:
                                sib.append(og)
                        for s in sib[: cfg.max_sibling_fanout]:
                            out.append(("sib", tuple(sorted((g.gid, s)))))
            if cfg.allow_duplication:
                for p in producers(g):
                    if self._dupable(groups[p], nodes, holders):
                        out.append(("dup", (p,)))
            return out

        fusable_groups = [g for g in groups.values() if nodes[g.members[0]].fusable]
        seen_c = set()
        for g in fusable_groups:
            for kind, gids in candidates_of(g):
                if (kind, gids) in seen_c:
                    continue
                seen_c.add((kind, gids))
                if all(nodes[groups[x].members[0]].fusable for x in gids):
                    push(kind, gids)

        merges = 0
        while heap:
            neg, _, kind, gids, vers = heapq.heappop(heap)
            if any(not groups[g].alive for g in gids if g in groups) or any(g not in groups for g in gids):
                continue
            if tuple(groups[g].version for g in gids) != vers:
                push(kind, gids)    # re-score against the current groups
                continue
            gain, members, detail, reason = evaluate(kind, gids)
            if reason is not None:
                continue
            merges += 1
            if kind == "dup":
                where = _label(nodes, groups[gids[0]].members)
                touched = self._apply_dup(groups[gids[0]], groups, owner, holders, copies, nodes)
                self.report.record(SWITCH, True, where=where, kind="duplicate", **detail)
                for t in touched:
                    cost_cache.pop((t.gid, t.version - 1), None)
                    for k, ids in candidates_of(t):
                        if all(x in groups and nodes[groups[x].members[0]].fusable for x in ids):
                            push(k, ids)
                continue
            a, b = groups[gids[0]], groups[gids[1]]
            new = Group(next(next_gid), members, a.owner_of | b.owner_of)
            a.alive = b.alive = False
            del groups[a.gid], groups[b.gid]
            groups[new.gid] = new
            for m in new.owner_of:
                owner[m] = new.gid
            for m in set(new.members) - new.owner_of:
                copies[m] = (copies[m] - {a.gid, b.gid}) | {new.gid}
            self.report.record(SWITCH, True, where=_label(nodes, members), kind=kind, **detail)
            for k, ids in candidates_of(new):
                if all(x in groups and nodes[groups[x].members[0]].fusable for x in ids):
                    push(k, ids)

        # What was left on the table, and why (one record per remaining producer->consumer edge).
        recorded = set()
        for g in list(groups.values()):
            if not nodes[g.members[0]].fusable:
                continue
            for c in consumers(g):
                if (g.gid, c) in recorded:
                    continue
                if not nodes[groups[c].members[0]].fusable:
                    continue
                recorded.add((g.gid, c))
                _, members, detail, reason = evaluate("pc", (g.gid, c))
                if reason == CHECK_FAILED and detail.get("why") == "opaque op":
                    continue
                self.report.record(SWITCH, False, reason or NOT_PROFITABLE,
                                   where=f"{_label(nodes, groups[g.gid].members)} -> "
                                         f"{_label(nodes, groups[c].members)}", kind="producer_consumer",
                                   **(detail or {}))
            if cfg.allow_duplication and self._dupable(g, nodes, holders):
                gain, _, detail, reason = evaluate("dup", (g.gid,))
                if reason is not None:
                    self.report.record(SWITCH, False, reason, where=_label(nodes, g.members), kind="duplicate",
                                       **(detail or {}))
        self.stats = {"merges": merges, "groups": sum(1 for g in groups.values() if len(g.members) > 1)}
        st = section.setdefault("stats", {"merges": 0, "call_tirs": 0, "seconds": 0.0})
        st["merges"] += merges
        st["call_tirs"] += sum(1 for n in nodes if n.call is not None)
        return self._emit(block, nodes, groups, owner, group_of, model, bb, section, target, cost_of)

    # ---- duplication ---------------------------------------------------------------------------------------
    def _dupable(self, g: Group, nodes, holders) -> bool:
        if len(g.members) != 1:
            return False
        n = nodes[g.members[0]]
        if n.locked is not None or not n.fusable or n.escapes or n.cube or n.pattern > INJECTIVE or len(n.users) < 2:
            return False
        if not all(nodes[u].fusable and holders(u) for u in n.users):
            return False
        return len(_consumer_groups(n, holders)) >= 2

    def _eval_dup(self, g, groups, holders, nodes, model, gcost, cost_of, group_of, target):
        cfg = self.config
        p = g.members[0]
        cons = _consumer_groups(nodes[p], holders)
        before = cost_of(g).time_us(target)
        after = 0.0
        detail = {}
        for c in cons:
            cg = groups[c]
            members = sorted(set(cg.members) | {p})
            why = model.structure(members)
            if why or len(members) > cfg.max_ops:
                return None, members, {"why": why or "max_ops"}, CHECK_FAILED if why else CAP_HIT
            before += cost_of(cg).time_us(target)
            (cc, chk), ins, _ = gcost(members, copied=(p,))
            if cc is None:
                return None, members, {"needed_bytes": chk.needed_bytes, "available_bytes": chk.available_bytes,
                                       "scope": chk.scope}, UB_OVERFLOW
            if len(ins) > cfg.max_params:
                return None, members, {"cap": "max_params", "params": len(ins)}, CAP_HIT
            after += cc.time_us(target)
        detail = {"copies": len(cons), "modeled_us_unfused": round(before, 4), "modeled_us_fused": round(after, 4),
                  "modeled_gain_us": round(before - after, 4)}
        if not accept(before - after, before, cfg):
            return None, [p], detail, NOT_PROFITABLE
        return before - after, [p], detail, None

    def _apply_dup(self, g, groups, owner, holders, copies, nodes):
        p = g.members[0]
        cons = _consumer_groups(nodes[p], holders)
        g.alive = False
        del groups[g.gid]
        owner.pop(p, None)
        copies[p] = set(cons)
        touched = []
        for c in cons:
            cg = groups[c]
            cg.members = sorted(set(cg.members) | {p})
            cg.version += 1
            touched.append(cg)
        return touched

    # ---- emission ------------------------------------------------------------------------------------------
    def _pattern_of(self, g, nodes):
        pids = {nodes[m].locked for m in g.members if nodes[m].locked is not None}
        return self._patterns[min(pids)] if pids else None

    def _emit(self, block, nodes, groups, owner, group_of, model, bb, section, target, cost_of):
        fused = [g for g in groups.values() if len(g.members) > 1 and not (
            self._pattern_of(g, nodes) is not None and sorted(self._pattern_of(g, nodes)["nodes"]) == sorted(g.members))]
        if not fused:
            return block
        # units in a topological order that follows the original binding order where it can
        unit_of: dict[int, int] = {}
        for g in groups.values():
            for m in g.owner_of:
                unit_of[m] = g.gid
        deps: dict[int, set] = {g.gid: set() for g in groups.values()}
        for g in groups.values():
            for m in g.members:
                for p in nodes[m].producers:
                    up = unit_of.get(p)
                    if up is not None and up != g.gid and p not in g.members:
                        deps[g.gid].add(up)
        order_key = {g.gid: min(g.owner_of) if g.owner_of else min(g.members) for g in groups.values()}
        indeg = {k: len(v) for k, v in deps.items()}
        rev: dict[int, list] = {k: [] for k in deps}
        for k, v in deps.items():
            for d in v:
                rev[d].append(k)
        ready = [(order_key[k], k) for k, d in indeg.items() if d == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, k = heapq.heappop(ready)
            order.append(k)
            for r in rev[k]:
                indeg[r] -= 1
                if indeg[r] == 0:
                    heapq.heappush(ready, (order_key[r], r))
        if len(order) != len(deps):
            raise RuntimeError("CostBasedFusionPass produced a cyclic grouping (internal error)")
        # A node duplicated into several groups reads its producer in each of them, so a value must leave its
        # group whenever any other unit reads it (outputs() alone only sees the producer's own user list).
        read_by: dict = {}
        for g in groups.values():
            used = set(model.inputs(g.members))
            for m in g.members:
                if nodes[m].call is None and isinstance(nodes[m].binding, relax.VarBinding):
                    used |= set(_free_vars(nodes[m].binding.value))
            for var in used:
                read_by.setdefault(var, set()).add(g.gid)
        self._read_by = read_by
        bindings = []
        for gid in order:
            g = groups[gid]
            pat = self._pattern_of(g, nodes)
            if len(g.members) == 1 and pat is None:
                bindings.append(nodes[g.members[0]].binding)
                continue
            if pat is not None and sorted(pat["nodes"]) == sorted(g.members):
                bindings.append(pat["binding"])      # an untouched pattern group stays as it was
                continue
            bindings += self._emit_group(g, block, nodes, model, group_of, bb, section, target, cost_of)
        return relax.DataflowBlock(bindings)

    def _emit_group(self, g, block, nodes, model, group_of, bb, section, target, cost_of):
        members = g.members
        ins = model.inputs(members)
        outs = set(model.outputs(members, group_of))
        outs |= {m for m in members if self._read_by.get(nodes[m].var, set()) - {g.gid}}
        outs = [m for m in members if m in outs]
        params, remap = [], {}
        for i, key in enumerate(ins):
            pv = relax.Var(f"p{i}", key.ty)
            params.append(pv)
            remap[key] = pv
        names = [nodes[m].name for m in members]
        pat = self._pattern_of(g, nodes)
        attrs = {"Primitive": True}
        pids = sorted({nodes[m].locked for m in members if nodes[m].locked is not None})
        if len(pids) > 1:
            # two pattern kernels merged (a chained GEMM): both names, the first pattern for the kernel table
            name = "_".join(self._patterns[p]["gv"] for p in pids)
            attrs["Composite"] = pat["name"]
        elif pat is not None:
            # keep the pattern's kernel name (and its Composite name for the kernel table), plus what joined it
            extra = [nodes[m].name for m in members if nodes[m].locked is None]
            name = pat["gv"] + "_" + "_".join(extra) if extra else pat["gv"] + "_merged"
            attrs["Composite"] = pat["name"]
        else:
            name = "fused_" + "_".join(names)
        if len(name) > 80:
            name = name[:80]
        fbb = relax.BlockBuilder()
        with fbb.function(name, params, attrs=attrs, private=True):
            with fbb.dataflow():
                local = dict(remap)
                out_vals = {}
                for m in members:
                    n = nodes[m]
                    args = [local[a] for a in n.args]
                    call = relax.call_tir(n.call.args[0], relax.Tuple(args), n.call.ty_args[0]
                                          if len(n.call.ty_args) == 1 else list(n.call.ty_args))
                    if m in outs and len(outs) == 1:
                        v = fbb.emit_output(call, name_hint=n.var.name)
                    else:
                        v = fbb.emit(call, name_hint=n.var.name)
                    local[n.var] = v
                    out_vals[m] = v
                if len(outs) == 1:
                    result = out_vals[outs[0]]
                else:
                    result = fbb.emit_output(relax.Tuple([out_vals[o] for o in outs]))
            fbb.emit_func_output(result)
        func = fbb.get()[name]
        gv = bb.add_func(func, name)
        call = relax.Call(gv, list(ins.keys()))
        lead = nodes[outs[0]]
        bindings = []
        if len(outs) == 1:
            bindings.append(relax.VarBinding(lead.var, bb.normalize(call)))
        else:
            ncall = bb.normalize(call)
            tmp = relax.DataflowVar(f"{lead.var.name}_grp", ncall.ty)
            bindings.append(relax.VarBinding(tmp, ncall))
            for i, o in enumerate(outs):
                bindings.append(relax.VarBinding(nodes[o].var, bb.normalize(relax.TupleGetItem(tmp, i))))
        c = cost_of(g)
        alone = {m: _single_cost(model, m, group_of).time_us(target) for m in members}
        # "unfused": the owned ops as their own kernels (sums to the block's unfused time over all groups);
        # "parts": also the duplicated producers this group recomputes, i.e. every kernel the group replaces
        section["groups"].append({
            "name": gv.name_hint, "ops": names, "pattern": pat["name"] if pat is not None else None,
            "outputs": len(outs), "inputs": len(ins),
            "modeled_gm_bytes": int(c.dense_bytes) if c else None,
            "modeled_gm_bytes_padded": int(c.gm_bytes) if c else None, "tiles": c.tiles if c else None,
            "modeled_time_us": round(c.time_us(target), 4) if c else None,
            "duplicated_ops": len(set(members) - g.owner_of),
            "modeled_time_us_unfused": round(sum(t for m, t in alone.items() if m in g.owner_of), 4),
            "modeled_time_us_parts": round(sum(alone.values()), 4)})
        chain = model.chain(members)
        if isinstance(chain, Chain):
            section["groups"][-1]["chain"] = chain.describe(max(nodes[m].out_dtype for m in members), target,
                                                            nodes)
        return bindings


def _consumer_groups(node, holders) -> list:
    """gids of the groups that read ``node`` (a user that is itself duplicated is read by all its copies)."""
    return sorted(set().union(*(holders(u) for u in node.users)))


def _single_cost(model, m, group_of):
    ins = model.inputs([m])
    outs = [m]
    c, _ = model.cost([m], outs, ins)
    return c if c is not None else GroupCost(0, 0, 0, 1, False)


def _label(nodes, members) -> str:
    return "+".join(nodes[m].name or nodes[m].var.name for m in members)


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


def _free_vars(expr) -> list:
    found = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
    return found


def _free_vars_binding(b) -> list:
    return _free_vars(b.value) if hasattr(b, "value") else []
