"""The groups of a finished queue back into Relax: one private ``Primitive`` function per group of two or more
call_tirs (FuseTIR turns each into one PrimFunc), the block's bindings in a topological order that follows
the original binding order where it can, and one row per emitted group in ``report.sections['grouping']``.

A pattern group nothing joined keeps its binding as it was; a group that merged pattern groups keeps the
pattern's kernel and Composite names (the kernel table reads them).
"""

from __future__ import annotations

import heapq

import tvm
from tvm import relax, tirx

from ..target import AscendTarget
from .chain import Chain
from .graph import BlockGraph, PatternGroup, free_vars
from .model import FusionModel
from .queue import FusionQueue, Group


def emit_block(block: relax.DataflowBlock, graph: BlockGraph, model: FusionModel, queue: FusionQueue,
               bb: relax.BlockBuilder, section: dict, target: AscendTarget) -> relax.DataflowBlock:
    """The block with the queue's groups as calls of new functions added to ``bb`` (``block`` itself when
    nothing was fused)."""
    return _Emitter(graph, model, queue, bb, section, target).emit(block)


class _Emitter:
    def __init__(self, graph, model, queue, bb, section, target):
        self.graph, self.nodes, self.model, self.queue = graph, graph.nodes, model, queue
        self.bb, self.section, self.target = bb, section, target
        self._exported = set()     # vars bound by the groups emitted so far

    def pattern_of(self, g: Group) -> PatternGroup | None:
        pids = {self.nodes[m].locked for m in g.members if self.nodes[m].locked is not None}
        return self.graph.patterns[min(pids)] if pids else None

    def emit(self, block):
        nodes, groups = self.nodes, self.queue.groups
        fused = [g for g in groups.values() if len(g.members) > 1 and not (
            self.pattern_of(g) is not None and sorted(self.pattern_of(g).nodes) == sorted(g.members))]
        if not fused:
            return block
        order = self._unit_order()
        read_by = self._read_by()
        bindings = []
        for gid in order:
            g = groups[gid]
            pat = self.pattern_of(g)
            if len(g.members) == 1 and pat is None:
                bindings.append(nodes[g.members[0]].binding)
                continue
            if pat is not None and sorted(pat.nodes) == sorted(g.members):
                bindings.append(pat.binding)      # an untouched pattern group stays as it was
                continue
            bindings += self._emit_group(g, read_by)
        return relax.DataflowBlock(bindings)

    def _unit_order(self) -> list[int]:
        """Group ids in a topological order; among ready groups, the one whose first owned op comes first."""
        nodes, groups = self.nodes, self.queue.groups
        unit_of: dict[int, int] = {}
        for g in groups.values():
            for m in g.owner_of:
                unit_of[m] = g.gid
        deps: dict[int, set] = {g.gid: set() for g in groups.values()}
        for g in groups.values():
            for m in g.members:
                for p in nodes[m].producers:
                    if p in g.members:
                        continue
                    up = unit_of.get(p)
                    if up is not None and up != g.gid:
                        deps[g.gid].add(up)
                    elif up is None:
                        # an op no group owns, recomputed in the groups holding a copy: one of them exports
                        # it (``_emit_group``), so a reader comes after all of them
                        deps[g.gid] |= set(self.queue.copies.get(p, ())) - {g.gid}
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
        return order

    def _read_by(self) -> dict:
        """Tensor -> gids of the groups reading it. A node duplicated into several groups reads its producer
        in each of them, so a value must leave its group whenever any other unit reads it (``outputs()``
        alone only sees the producer's own user list)."""
        nodes, read_by = self.nodes, {}
        for g in self.queue.groups.values():
            used = set(self.model.inputs(g.members))
            for m in g.members:
                if nodes[m].call is None and isinstance(nodes[m].binding, relax.VarBinding):
                    used |= set(free_vars(nodes[m].binding.value))
            for var in used:
                read_by.setdefault(var, set()).add(g.gid)
        return read_by

    def _emit_group(self, g: Group, read_by: dict) -> list:
        nodes, model, bb = self.nodes, self.model, self.bb
        members = g.members
        ins = model.inputs(members)
        outs = set(model.outputs(members, self.queue.group_of))
        outs |= {m for m in members if read_by.get(nodes[m].var, set()) - {g.gid}}
        # a copy (an op recomputed in several groups) leaves through the first group emitted with it: two
        # groups exporting it would bind its var twice in the block
        outs = [m for m in members if m in outs and (m in g.owner_of or nodes[m].var not in self._exported)]
        self._exported.update(nodes[m].var for m in outs)
        params, remap, sizes = [], {}, []
        for i, key in enumerate(ins):
            if tvm.ir.is_prim_expr(key):
                # a symbolic size a kernel takes as a scalar (call_tir's tir var argument) stays the caller's
                # var, defined in the group by one R.Shape parameter as TVM's FuseOps does: a fresh
                # parameter would be another var than the one in the tensor parameters' shapes, and the
                # fused kernel then used a var it is not passed ("variables (past,) are used, but are not
                # passed in as API arguments")
                remap[key] = key
                sizes += [v for v in tirx.analysis.undefined_vars(key) if not any(v.same_as(s) for s in sizes)]
                continue
            pv = relax.Var(f"p{i}", key.ty)
            params.append(pv)
            remap[key] = pv
        # dims of the members' types that no tensor parameter defines (the signature's, ``undefined_dim``)
        defined = [v for p in params for v in relax.analysis.definable_tir_vars_in_type(p.ty)]
        for m in members:
            for v in relax.analysis.tir_vars_in_type(nodes[m].var.ty):
                if not any(v.same_as(d) for d in defined + sizes):
                    sizes.append(v)
        if sizes:
            params.append(relax.Var("tir_vars", relax.ShapeType(sizes)))
        names = [nodes[m].name for m in members]
        pat = self.pattern_of(g)
        attrs = {"Primitive": True}
        pids = sorted({nodes[m].locked for m in members if nodes[m].locked is not None})
        if len(pids) > 1:
            # two pattern kernels merged (a chained GEMM): both names, the first pattern for the kernel table
            name = "_".join(self.graph.patterns[p].gv for p in pids)
            attrs["Composite"] = pat.name
        elif pat is not None:
            # keep the pattern's kernel name (and its Composite name for the kernel table), plus what joined it
            extra = [nodes[m].name for m in members if nodes[m].locked is None]
            name = pat.gv + "_" + "_".join(extra) if extra else pat.gv + "_merged"
            attrs["Composite"] = pat.name
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
        call = relax.Call(gv, [k for k in ins if not tvm.ir.is_prim_expr(k)]
                          + ([relax.ShapeExpr(sizes)] if sizes else []))
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
        self._report_row(g, gv.name_hint, names, pat, len(outs), len(ins))
        return bindings

    def _report_row(self, g: Group, name: str, names: list, pat: PatternGroup | None, n_outs: int, n_ins: int):
        target, members = self.target, g.members
        c = self.queue.cost_of(g)
        alone = {m: self.model.alone(m).time_us(target) for m in members}
        # "unfused": the owned ops as their own kernels (sums to the block's unfused time over all groups);
        # "parts": also the duplicated producers this group recomputes, i.e. every kernel the group replaces
        row = {
            "name": name, "ops": names, "pattern": pat.name if pat is not None else None,
            "outputs": n_outs, "inputs": n_ins,
            "modeled_gm_bytes": int(c.dense_bytes) if c else None,
            "modeled_gm_bytes_padded": int(c.gm_bytes) if c else None, "tiles": c.tiles if c else None,
            "modeled_time_us": round(c.time_us(target), 4) if c else None,
            "duplicated_ops": len(set(members) - g.owner_of),
            "modeled_time_us_unfused": round(sum(t for m, t in alone.items() if m in g.owner_of), 4),
            "modeled_time_us_parts": round(sum(alone.values()), 4),
            # the member ops by position in their block: what the pipeline forbids when the kernel overflows
            "block": self.graph.key, "members": list(members)}
        chain = self.model.chain(members)
        if isinstance(chain, Chain):
            row["chain"] = chain.describe(max(self.nodes[m].out_dtype for m in members), target, self.nodes)
        self.section["groups"].append(row)
