"""The priority-fusion queue: one object owns a run's grouping state over one dataflow block.

Every call_tir starts as its own group (a pattern group's call_tirs as one). Candidate merges — producer
into consumer (``pc``), two readers of one tensor (``sib``), and a cheap producer duplicated into all its
consumers (``dup``) — are evaluated (legality, then the modeled gain of ``FusionModel``) and pushed on a
heap by gain; the largest is taken first. After a merge only the candidates touching the changed groups are
pushed again; an entry whose groups changed since it was pushed (version) is re-evaluated when popped, so
the work is proportional to the graph's edges, not quadratic. Ties (gains equal after rounding to 1e-6 us)
are taken in push order.

A merge is legal when every op is fusable, the structure is one kernel (``FusionModel.structure``), no cap
(ops, depth, parameters) is hit, one tile fits UB/L0, the group stays convex (no path leaves it and
comes back, copies of duplicated producers included), and a schedule rule takes the merged kernel at least as
well as it takes the parts (``schedulable``: the rule table of ``rule_specs.py``, asked with the ops' kinds,
no schedule built). Every decision is a ``Decision``; taken merges and, at the end, every candidate left open
are recorded in the report with their reason and numbers.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from tvm import relax

from ..report import (CAP_HIT, CHECK_FAILED, CYCLE, NO_SCHEDULE, NOT_PROFITABLE, SLOWER_SCHEDULE, UB_OVERFLOW,
                      FusionReport)
from ..rule_specs import GENERIC, GroupShape, RuleSpec, group_shape, predict_rule
from ..switches import COST_BASED_FUSION
from ..target import AscendTarget
from .chain import Chain
from .cost import GroupingConfig, accept
from .graph import INJECTIVE, BlockGraph
from .model import FusionModel

PRODUCER_CONSUMER, SIBLING, DUPLICATE = "pc", "sib", "dup"


@dataclass
class Group:
    gid: int
    members: list                    # node indices in binding order (duplicated copies included)
    owner_of: set                    # members this group owns (not duplicated copies)
    version: int = 0
    alive: bool = True


@dataclass(frozen=True)
class Decision:
    """The outcome of evaluating one candidate: merge, or refuse for ``reason`` (a report reason code).

    ``members``: the group the merge makes (for a duplication, the duplicated producer); ``detail``: the
    numbers behind it (modeled times, bytes needed vs available, the cap hit), as recorded in the report."""

    merge: bool
    reason: str | None
    gain_us: float | None
    members: tuple
    detail: dict = field(default_factory=dict)

    @staticmethod
    def take(gain_us: float, members, detail: dict) -> "Decision":
        return Decision(True, None, gain_us, tuple(members), detail)

    @staticmethod
    def refuse(reason: str, members, detail: dict) -> "Decision":
        return Decision(False, reason, None, tuple(members), detail)


class FusionQueue:
    """Groups, owners, copies, the heap and the cost cache of one run; ``run()`` merges until the heap is
    empty and records what was left."""

    def __init__(self, graph: BlockGraph, model: FusionModel, config: GroupingConfig, target: AscendTarget,
                 report: FusionReport):
        self.graph, self.nodes, self.model = graph, graph.nodes, model
        self.cfg, self.target, self.report = config, target, report
        self.groups: dict[int, Group] = {}
        self.owner: dict[int, int] = {}      # node -> gid of the group that owns it
        self._consumers: dict[int, set] = {}  # gid -> consumers(group), valid until the grouping changes
        # A duplicated node has no owner: its copies live in the groups of its users. Edges into those copies
        # are real dependences, so every graph walk must see them (else a merge that closes a cycle through
        # a copy looks convex).
        self.copies: dict[int, set] = {}     # duplicated node -> gids of the groups holding a copy
        self.merges = 0
        self._heap: list = []
        self._seq = itertools.count()        # push order: the tie-break between equal gains
        self._cost_cache: dict = {}          # (gid, version) -> GroupCost
        self._rule_cache: dict = {}          # (gid, version) -> RuleSpec the group's kernel would get
        self.schedule_refusals: dict = {}    # reason -> member sets of the merges the rule table refused
        locked = set()
        for pid, pat in enumerate(graph.patterns):
            gid = len(self.nodes) + pid
            self.groups[gid] = Group(gid, list(pat.nodes), set(pat.nodes))
            for m in pat.nodes:
                self.owner[m] = gid
                locked.add(m)
        for n in self.nodes:
            if n.idx not in locked:
                self.groups[n.idx] = Group(n.idx, [n.idx], {n.idx})
                self.owner[n.idx] = n.idx
        self._next_gid = itertools.count(len(self.nodes) + len(graph.patterns))

    # ---- the current grouping --------------------------------------------------------------------------
    def group_of(self, node_idx) -> Group | None:
        og = self.owner.get(node_idx)
        return self.groups.get(og) if og is not None else None

    def holders(self, node_idx) -> set:
        og = self.owner.get(node_idx)
        return {og} if og is not None else self.copies.get(node_idx, set())

    def producers(self, g: Group) -> set:
        out = set()
        for m in g.members:
            for p in self.nodes[m].producers:
                og = self.owner.get(p)
                if og is not None and og != g.gid and p not in g.members:
                    out.add(og)
        return out

    def consumers(self, g: Group) -> set:
        """gids of the groups reading ``g`` (do not modify: kept until the next merge or duplication, as
        ``reaches`` asks for the same groups again and again: an unrolled recurrence's chain of steps made
        the cycle checks most of the grouping's time)."""
        out = self._consumers.get(g.gid)
        if out is not None:
            return out
        out = set()
        for m in g.owner_of:
            for u in self.nodes[m].users:
                out |= self.holders(u)
        out.discard(g.gid)
        self._consumers[g.gid] = out
        return out

    def reaches(self, src: Group, dst: Group, skip_direct: bool) -> bool:
        """Is there a path src -> ... -> dst through some third group?"""
        stack = [c for c in self.consumers(src) if c != dst.gid] if skip_direct else list(self.consumers(src))
        seen = set()
        while stack:
            gid = stack.pop()
            if gid in seen:
                continue
            seen.add(gid)
            if gid == dst.gid:
                return True
            stack.extend(self.consumers(self.groups[gid]))
        return False

    def consumer_groups(self, node_idx) -> list:
        """gids of the groups that read a node (a user that is itself duplicated is read by all its copies)."""
        return sorted(set().union(*(self.holders(u) for u in self.nodes[node_idx].users)))

    def group_cost(self, members, copied=()):
        """((cost, capacity check), inputs, outputs) of ``members`` as one group of the current grouping."""
        ins = self.model.inputs(members)
        outs = [o for o in self.model.outputs(members, self.group_of) if o not in copied]
        return self.model.cost(members, outs, ins), ins, outs

    def cost_of(self, g: Group):
        key = (g.gid, g.version)
        if key not in self._cost_cache:
            (c, _chk), _, _ = self.group_cost(g.members)
            self._cost_cache[key] = c
        return self._cost_cache[key]

    # ---- which rule a kernel would get (rule_specs.py) -----------------------------------------------------
    def kernel_outputs(self, members, gids) -> list:
        """``FusionModel.outputs`` plus the members read by a copy of a duplicated op that is also held by a
        group other than ``gids``: that copy reads the value from GM, so it leaves this kernel too."""
        mset = set(members)
        outs = self.model.outputs(members, self.group_of)
        elsewhere = {u for u, held in self.copies.items() if u in mset and held - set(gids)}
        if elsewhere:
            outs += [m for m in members if m not in outs and elsewhere & set(self.nodes[m].users)]
        return outs

    def shape_of(self, members, outs) -> GroupShape:
        """The rule table's view of ``members`` as one kernel whose values ``outs`` leave it."""
        pos = {m: i for i, m in enumerate(members)}
        nodes = self.nodes
        return group_shape([nodes[m].kind for m in members],
                           [{pos[p] for p in nodes[m].producers if p in pos} for m in members],
                           {pos[o] for o in outs if o in pos}, [nodes[m].rows for m in members])

    def rule_of(self, g: Group) -> RuleSpec:
        """The rule the group's kernel would get as it stands."""
        key = (g.gid, g.version)
        if key not in self._rule_cache:
            self._rule_cache[key] = predict_rule(self.shape_of(g.members, self.kernel_outputs(g.members, (g.gid,))))
        return self._rule_cache[key]

    def schedulable(self, members, gids, parts, detail: dict, copied=()) -> Decision | None:
        """The refusal of a merge whose kernel a rule would schedule worse than each of its parts, else None:
        ``no_schedule`` when only the fallback rule would take it, ``slower_schedule`` when a rule ranked below
        every part's would (``rule_specs``' ranks). A part already on the fallback rule loses nothing by
        merging; a merge onto a rule as good as one part's is left to the cost model. ``copied``: a producer
        duplicated into the group (its value then leaves no kernel)."""
        if not self.cfg.schedulable_only:
            return None
        shape = self.shape_of(members, [o for o in self.kernel_outputs(members, gids) if o not in copied])
        fused = predict_rule(shape)
        rules = [self.rule_of(g) for g in parts]
        if fused.rank >= min(r.rank for r in rules):
            return None
        reason = NO_SCHEDULE if fused.rank == GENERIC else SLOWER_SCHEDULE
        self.schedule_refusals.setdefault(reason, set()).add(tuple(members))
        return Decision.refuse(reason, members, {
            **detail, "rule_fused": fused.name, "rules_parts": [r.name for r in rules], "kinds_fused": shape.kinds,
            "kinds_parts": [self.shape_of(g.members, self.kernel_outputs(g.members, (g.gid,))).kinds for g in parts]})

    def _fusable(self, gids) -> bool:
        return all(x in self.groups and self.nodes[self.groups[x].members[0]].fusable for x in gids)

    # ---- candidates and priorities ---------------------------------------------------------------------
    def candidates(self, g: Group) -> list:
        """(kind, gids) of every merge touching ``g``."""
        cfg, out = self.cfg, []
        for p in self.producers(g):
            out.append((PRODUCER_CONSUMER, (p, g.gid)))
        for c in self.consumers(g):
            out.append((PRODUCER_CONSUMER, (g.gid, c)))
        if cfg.allow_siblings:
            for key in self.model.inputs(g.members):
                if isinstance(key, relax.Var):
                    sib = []
                    for r in self.graph.readers.get(key, []):
                        og = self.owner.get(r)
                        if og is not None and og != g.gid and og not in sib:
                            sib.append(og)
                    for s in sib[: cfg.max_sibling_fanout]:
                        out.append((SIBLING, tuple(sorted((g.gid, s)))))
        if cfg.allow_duplication:
            for p in self.producers(g):
                if self.duplicable(self.groups[p]):
                    out.append((DUPLICATE, (p,)))
        return out

    def push(self, kind: str, gids) -> None:
        """Evaluate a candidate against the current groups; queue it by gain when it would merge."""
        gids = tuple(gids)
        decision = self.evaluate(kind, gids)
        if decision.merge:
            vers = tuple(self.groups[g].version for g in gids)
            # gains equal up to float rounding (one saved round trip of the same tensor, reached by
            # different sums) are ties, taken in push order: producer-side merges first
            heapq.heappush(self._heap, (-round(decision.gain_us, 6), next(self._seq), kind, gids, vers))

    def update_priorities(self, g: Group) -> None:
        """Push the candidates of a group that just changed."""
        for kind, gids in self.candidates(g):
            if self._fusable(gids):
                self.push(kind, gids)

    # ---- evaluation --------------------------------------------------------------------------------------
    def legal(self, members, a: Group, b: Group | None) -> Decision | None:
        """The refusal of a merge that may not be made, else None."""
        nodes, cfg = self.nodes, self.cfg
        if any(not nodes[m].fusable for m in members):
            return Decision.refuse(CHECK_FAILED, members, {"why": "opaque op"})
        why = self.model.structure(members)
        if why:
            return Decision.refuse(CHECK_FAILED, members, {"why": why})
        if len(members) > cfg.max_ops:
            return Decision.refuse(CAP_HIT, members, {"cap": "max_ops", "ops": len(members), "limit": cfg.max_ops})
        d = self.model.depth(members)
        if d > cfg.max_depth:
            return Decision.refuse(CAP_HIT, members, {"cap": "max_depth", "depth": d, "limit": cfg.max_depth})
        for key, group, needed, available in cfg.forbidden:
            if key == self.graph.key and set(group) <= set(members):
                return Decision.refuse(UB_OVERFLOW, members, {
                    "why": "the kernel of these ops exceeded on-chip capacity once scheduled",
                    "needed_bytes": needed, "available_bytes": available, "verified": True})
        if b is not None and (self.reaches(a, b, True) or self.reaches(b, a, True)):
            return Decision.refuse(CYCLE, members, {})
        return None

    def evaluate(self, kind: str, gids) -> Decision:
        """Legality, capacity, caps and modeled gain of one candidate over the current groups."""
        cfg, target = self.cfg, self.target
        gs = [self.groups[g] for g in gids]
        if kind == DUPLICATE:
            if not self.duplicable(gs[0]):
                # a stale candidate: the group took a copy of another producer since it was pushed
                return Decision.refuse(CHECK_FAILED, gs[0].members, {"why": "no longer a single duplicable op"})
            return self._evaluate_duplicate(gs[0])
        a, b = gs
        members = sorted(set(a.members) | set(b.members))
        refusal = self.legal(members, a, b)
        if refusal is not None:
            return refusal
        (c, chk), ins, outs = self.group_cost(members)
        if not cfg.allow_multi_output and len(outs) > 1:
            return Decision.refuse(CHECK_FAILED, members, {"why": "multi-output groups switched off"})
        if c is None:
            return Decision.refuse(UB_OVERFLOW, members, {
                "needed_bytes": chk.needed_bytes, "available_bytes": chk.available_bytes, "scope": chk.scope,
                **({"what": chk.what} if chk.what else {})})
        if len(ins) > cfg.max_params:
            return Decision.refuse(CAP_HIT, members, {"cap": "max_params", "params": len(ins),
                                                      "limit": cfg.max_params})
        before = self.cost_of(a).time_us(target) + self.cost_of(b).time_us(target)
        after = c.time_us(target)
        detail = {"modeled_us_unfused": round(before, 4), "modeled_us_fused": round(after, 4),
                  "modeled_gain_us": round(before - after, 4)}
        if not accept(before - after, before, cfg):
            return Decision.refuse(NOT_PROFITABLE, members, detail)
        chain = self.model.chain(members)
        saving = chain.saving_vs_weights() if isinstance(chain, Chain) else None
        if saving is not None and saving < cfg.chain_min_saving_vs_weights:
            # the model counts the chain's weights once, but they are streamed again for every row block
            # (from L2): chain only when the intermediate's round trip is a clear share of those weights
            detail.update(why="intermediate round trip small next to the re-streamed weights",
                          saving_vs_weights=round(saving, 4), limit=cfg.chain_min_saving_vs_weights)
            return Decision.refuse(NOT_PROFITABLE, members, detail)
        refusal = self.schedulable(members, gids, (a, b), detail)
        if refusal is not None:
            return refusal
        return Decision.take(before - after, members, detail)

    def duplicable(self, g: Group) -> bool:
        """A single cheap (at most injective) op with two or more consumer groups, all fusable."""
        if len(g.members) != 1:
            return False
        n = self.nodes[g.members[0]]
        if n.locked is not None or not n.fusable or n.escapes or n.cube or n.pattern > INJECTIVE or len(n.users) < 2:
            return False
        if not all(self.nodes[u].fusable and self.holders(u) for u in n.users):
            return False
        return len(self.consumer_groups(n.idx)) >= 2

    def _evaluate_duplicate(self, g: Group) -> Decision:
        cfg, target = self.cfg, self.target
        p = g.members[0]
        cons = self.consumer_groups(p)
        before = self.cost_of(g).time_us(target)
        after = 0.0
        for c in cons:
            cg = self.groups[c]
            members = sorted(set(cg.members) | {p})
            why = self.model.structure(members)
            if why or len(members) > cfg.max_ops:
                return Decision.refuse(CHECK_FAILED if why else CAP_HIT, members, {"why": why or "max_ops"})
            before += self.cost_of(cg).time_us(target)
            (cc, chk), ins, _ = self.group_cost(members, copied=(p,))
            if cc is None:
                return Decision.refuse(UB_OVERFLOW, members, {
                    "needed_bytes": chk.needed_bytes, "available_bytes": chk.available_bytes, "scope": chk.scope})
            if len(ins) > cfg.max_params:
                return Decision.refuse(CAP_HIT, members, {"cap": "max_params", "params": len(ins)})
            refusal = self.schedulable(members, (c,), (cg, g), {"copies": len(cons)}, copied=(p,))
            if refusal is not None:
                return refusal
            after += cc.time_us(target)
        detail = {"copies": len(cons), "modeled_us_unfused": round(before, 4),
                  "modeled_us_fused": round(after, 4), "modeled_gain_us": round(before - after, 4)}
        if not accept(before - after, before, cfg):
            return Decision.refuse(NOT_PROFITABLE, [p], detail)
        return Decision.take(before - after, [p], detail)

    # ---- merging -----------------------------------------------------------------------------------------
    def run(self) -> "FusionQueue":
        """Seed the heap with every candidate, merge greedily until it is empty, record what was left."""
        self._seed()
        while (entry := self._pop()) is not None:
            kind, gids = entry
            decision = self.evaluate(kind, gids)
            if not decision.merge:
                continue
            self.merges += 1
            if kind == DUPLICATE:
                where = self.graph.label(self.groups[gids[0]].members)
                touched = self.duplicate(self.groups[gids[0]])
                self.report.record(COST_BASED_FUSION, True, where=where, kind="duplicate", **decision.detail)
                for t in touched:
                    self._cost_cache.pop((t.gid, t.version - 1), None)
                    self._rule_cache.pop((t.gid, t.version - 1), None)
                    self.update_priorities(t)
                continue
            new = self.merge(self.groups[gids[0]], self.groups[gids[1]], decision)
            self.report.record(COST_BASED_FUSION, True, where=self.graph.label(new.members), kind=kind,
                               **decision.detail)
            self.update_priorities(new)
        self.record_leftovers()
        return self

    def _seed(self) -> None:
        seen = set()
        for g in [g for g in self.groups.values() if self.nodes[g.members[0]].fusable]:
            for kind, gids in self.candidates(g):
                if (kind, gids) in seen:
                    continue
                seen.add((kind, gids))
                if self._fusable(gids):
                    self.push(kind, gids)

    def _pop(self):
        """(kind, gids) of the best candidate whose groups are unchanged since it was pushed, or None when the
        heap is empty. Entries of merged-away groups are dropped; entries of changed groups re-pushed."""
        while self._heap:
            _, _, kind, gids, vers = heapq.heappop(self._heap)
            if any(g not in self.groups or not self.groups[g].alive for g in gids):
                continue
            if tuple(self.groups[g].version for g in gids) != vers:
                self.push(kind, gids)    # re-evaluate against the current groups
                continue
            return kind, gids
        return None

    def merge(self, a: Group, b: Group, decision: Decision) -> Group:
        """Replace ``a`` and ``b`` by one new group of ``decision.members``."""
        self._consumers.clear()
        new = Group(next(self._next_gid), list(decision.members), a.owner_of | b.owner_of)
        a.alive = b.alive = False
        del self.groups[a.gid], self.groups[b.gid]
        self.groups[new.gid] = new
        for m in new.owner_of:
            self.owner[m] = new.gid
        for m in set(new.members) - new.owner_of:
            self.copies[m] = (self.copies[m] - {a.gid, b.gid}) | {new.gid}
        return new

    def duplicate(self, g: Group) -> list[Group]:
        """Dissolve a single-op group into a copy in each consumer group; returns those groups."""
        p = g.members[0]
        cons = self.consumer_groups(p)
        self._consumers.clear()
        g.alive = False
        del self.groups[g.gid]
        self.owner.pop(p, None)
        self.copies[p] = set(cons)
        touched = []
        for c in cons:
            cg = self.groups[c]
            cg.members = sorted(set(cg.members) | {p})
            cg.version += 1
            touched.append(cg)
        return touched

    # ---- end of run --------------------------------------------------------------------------------------
    def record_leftovers(self) -> None:
        """What was left on the table, and why (one record per remaining producer->consumer edge, and per
        producer that could have been duplicated)."""
        nodes, label, recorded = self.nodes, self.graph.label, set()
        for g in list(self.groups.values()):
            if not nodes[g.members[0]].fusable:
                continue
            for c in self.consumers(g):
                if (g.gid, c) in recorded:
                    continue
                if not nodes[self.groups[c].members[0]].fusable:
                    continue
                recorded.add((g.gid, c))
                d = self.evaluate(PRODUCER_CONSUMER, (g.gid, c))
                if d.reason == CHECK_FAILED and d.detail.get("why") == "opaque op":
                    continue
                self.report.record(COST_BASED_FUSION, False, d.reason or NOT_PROFITABLE,
                                   where=f"{label(self.groups[g.gid].members)} -> {label(self.groups[c].members)}",
                                   kind="producer_consumer", **d.detail)
            if self.cfg.allow_duplication and self.duplicable(g):
                d = self.evaluate(DUPLICATE, (g.gid,))
                if not d.merge:
                    self.report.record(COST_BASED_FUSION, False, d.reason, where=label(g.members),
                                       kind="duplicate", **d.detail)
