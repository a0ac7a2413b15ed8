"""What a candidate group would be as one kernel: its GM traffic and modeled cost, whether one tile fits the
on-chip buffers, and whether its structure is one the NPU runs as one kernel.

``FusionModel`` answers for any set of members of one ``BlockGraph``; it knows nothing of the current
grouping except through the ``group_of`` callable that ``outputs`` takes. The roofline itself is
``cost.GroupCost``, the capacity checks are ``capacity.py``, the chain shapes ``chain.py`` and
``attention_chain.py``.
"""

from __future__ import annotations

import dataclasses

from tvm import relax

from ..target import AscendTarget
from .attention_chain import AttentionChain, find_attention_chain
from ..tiling import TileBuffer, l0_check, ub_check
from .chain import Chain, find_chain, reachable
from .conv_prologue import prologue_op
from .cost import GroupCost, GroupingConfig, tiles_for
from .graph import INJECTIVE, OUT_EWISE, REDUCE, BlockGraph, tensor_dtype_bytes, tensor_elems


# Pattern families whose kernels take nothing but layout ops besides the pattern (see closed_pattern).
CLOSED_PATTERNS = ("ascendfuse.squeeze_excite.",)


class FusionModel:
    """Cost, capacity and structure of candidate groups over one dataflow block."""

    def __init__(self, graph: BlockGraph, target: AscendTarget, cfg: GroupingConfig):
        self.graph, self.target, self.cfg = graph, target, cfg
        self.nodes, self.var_node = graph.nodes, graph.var_node
        self._chains: dict[tuple, Chain | str | None] = {}   # cost, capacity and structure all ask per candidate
        self._dims_cache: dict[int, list] = {}
        self._inputs: dict[tuple, dict] = {}
        self._costs: dict[tuple, tuple] = {}

    def inputs(self, members: list[int]) -> dict:
        """External inputs: tensor -> (padded bytes, elems, dtype bytes, dense bytes). The queue asks again
        for every candidate it re-costs; the answer depends on the members only (a copy: callers may edit)."""
        key = tuple(members)
        if key not in self._inputs:
            self._inputs[key] = self._find_inputs(members)
        return dict(self._inputs[key])

    def _find_inputs(self, members: list[int]) -> dict:
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
                    old, full = ins[key], tensor_elems(a) * tensor_dtype_bytes(a)
                    pad = b / dense if dense else 1.0
                    ins[key] = (min(old[0] + b, max(old[0], b, full * pad)), old[1], old[2],
                                min(old[3] + dense, max(old[3], dense, full)))
                else:
                    ins[key] = (b, tensor_elems(a), tensor_dtype_bytes(a), dense)
        return ins

    def producer_of(self, arg):
        return self.var_node.get(arg) if isinstance(arg, relax.Var) else None

    def outputs(self, members: list[int], group_of) -> list[int]:
        """Members whose value leaves the group (escapes the block, or read by a group without a copy)."""
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
        """(cost, capacity check); the cost is None when one tile does not fit. The queue re-costs a candidate
        every time a group next to it changes (Whisper's encoder: 493 calls, 307 distinct): remembered."""
        key = (tuple(members), tuple(outs), tuple(ins))
        if key not in self._costs:
            self._costs[key] = self._cost(members, outs, ins)
        return self._costs[key]

    def _cost(self, members: list[int], outs: list[int], ins: dict) -> tuple[GroupCost | None, object]:
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

    def alone(self, m: int) -> GroupCost:
        """One node as its own kernel."""
        c, _ = self.cost([m], [m], self.inputs([m]))
        return c if c is not None else GroupCost(0, 0, 0, 1, False)

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
                if isinstance(found, Chain) and self.cfg.chain_host_cores > 0:
                    dt = max(self.nodes[m].out_dtype for m in members)
                    found = dataclasses.replace(
                        found, host=found.host_cost(self.cfg.chain_host_cores, dt, self.target))
                    if not found.host["chain_on_host"]:
                        found = found.host_refusal()
            self._chains[key] = found
        return self._chains[key]

    def on_chip_bytes(self, m: int) -> int:
        """Bytes of one element of member ``m``'s output on chip (16 bits under a 16-bit plan's target)."""
        return self.target.element_bytes(self.nodes[m].out_dtype_name)

    def _input_on_chip_bytes(self, tensor, nbytes: int) -> int:
        dtype = getattr(getattr(tensor, "ty", None), "dtype", None)
        return nbytes if dtype is None else self.target.element_bytes(dtype)

    def capacity(self, members, outs, ins):
        chain = self.chain(members)
        if isinstance(chain, Chain):
            dt = max(self.on_chip_bytes(m) for m in members)
            check = chain.capacity(dt, self.target)
            if check.fits:
                l0 = l0_check(dt, self.target)
                return check if l0.fits else l0
            return check
        bufs = [TileBuffer(v[1], self._input_on_chip_bytes(k, v[2])) for k, v in ins.items()]
        bufs += [TileBuffer(self.nodes[m].out_elems, self.on_chip_bytes(m)) for m in members]
        row = self.resident_row(members)
        min_tile = row if row else max(1, self.target.ub_align // 4)
        check = ub_check(bufs, min_tile, self.target)
        if check.fits and any(self.nodes[m].cube for m in members):
            l0 = l0_check(max(self.on_chip_bytes(m) for m in members), self.target)
            if not l0.fits:
                return l0
        return check

    def undefined_dim(self, members: list[int]) -> str | None:
        """A symbolic dim of a member's type that none of the group's inputs defines, else None.

        A grouped function gets its dims from its parameters' shapes, or as a size argument when the function
        signature defines them (``BlockGraph.signature_dims``: a decode step's cache length, in scope
        everywhere); a length computed at run time and bound by a match_cast (ONNX Range: ``arange(0, n)``
        then ``* delta + start``) is defined by no input of a group that takes the arange in, and the group's
        call_tir would have an output of unknown shape ("call_tir expects all TensorType has shape"). The
        arange stays its own call_tir, as TVM lowers it."""
        dims = [v for m in members for v in self._dims(m)]
        if not dims:
            return None
        defined = set(self.graph.signature_dims)
        for key in self.inputs(members):
            if isinstance(key, relax.Var):
                defined.update(relax.analysis.definable_tir_vars_in_type(key.ty))
        return next((v.name for v in dims if v not in defined), None)

    def _dims(self, m: int) -> list:
        if m not in self._dims_cache:
            self._dims_cache[m] = list(relax.analysis.tir_vars_in_type(self.nodes[m].var.ty))
        return self._dims_cache[m]

    def depth(self, members: list[int]) -> int:
        mset, d = set(members), {}
        for m in sorted(members):
            d[m] = 1 + max((d[p] for p in self.nodes[m].producers if p in mset and p in d), default=0)
        return max(d.values(), default=0)

    def conv_input_path(self, c: int, mset: set) -> set:
        """Members that feed conv ``c``'s data operand (transitively, inside ``mset``); empty when ``c`` is not
        a plain conv2d (``conv_prologue.conv_data_position``)."""
        n = self.nodes[c]
        if n.conv_data is None or n.conv_data >= len(n.args):
            return set()
        start = self.producer_of(n.args[n.conv_data])
        path, stack = set(), [start] if start is not None and start in mset else []
        while stack:
            p = stack.pop()
            if p in path:
                continue
            path.add(p)
            stack.extend(q for q in self.nodes[p].producers if q in mset)
        return path

    def closed_pattern(self, members: list[int]) -> str | None:
        """Pattern groups whose kernel rule schedules exactly the pattern take nothing but layout ops:
        squeeze-excite (``schedule/squeeze_excite.py``; its channel-wise multiply belongs in the next conv's
        input prologue)."""
        nodes = self.nodes
        pids = {nodes[m].locked for m in members if nodes[m].locked is not None}
        for pid in pids:
            if self.graph.patterns[pid].name.startswith(CLOSED_PATTERNS) and any(
                    nodes[m].locked != pid and nodes[m].pattern != INJECTIVE for m in members):
                return f"{self.graph.patterns[pid].name} takes only layout ops besides its pattern"
        return None

    def rearranges_group(self, m: int, mset: set) -> bool:
        """Every tensor node ``m`` reads is computed in the group (no input, constant or outside tensor)."""
        n = self.nodes[m]
        inside = {self.nodes[p].var for p in n.producers if p in mset}
        return bool(inside) and all(isinstance(a, relax.Var) and a in inside for a in n.args)

    def structure(self, members: list[int]) -> str | None:
        """None if the NPU can run these ops as one kernel, else what breaks it.

        A pattern group's own structure is taken as given (its checks already passed); the rules apply to
        what is added to it: one cube kernel per group; only layout (injective) ops in front of a cube
        operand (the DMA into L1 does them), and in front of a plain conv's data operand also per-channel
        elementwise ops (its input prologue, ``conv_prologue.py``); a reduction behind a cube op only when a row block of the
        accumulator (cube_m rows of the reduction row, fp32) fits L0C; at most ``max_reductions`` free
        reductions. An int8 cube op (8-bit operands) takes only its operands' and epilogue's ops, and no
        reduction: the int8 rules finish the accumulator tile in registers with an injective epilogue."""
        nodes, mset = self.nodes, set(members)
        closed = self.closed_pattern(members)
        if closed:
            return closed
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
            data_path = self.conv_input_path(c, mset)
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
                if p in data_path:
                    why = prologue_op(nodes[p])     # a conv's input prologue, applied as the input is staged
                    if why:
                        return why
                elif nodes[p].pattern != INJECTIVE and not nodes[p].widens:
                    # a 16-bit operand's conversion to float32 is done as the operand is staged
                    # (operand_cast.py); anything else computed there would be recomputed per tile
                    return "compute fused into a cube op's operand"
                stack.extend(q for q in nodes[p].producers if q in mset)
        if cubes:
            after_cube = reachable(nodes, cubes, mset, "users")
            gemms_only = all(nodes[c].row_operand for c in cubes)
            if any(nodes[m].concat and not (gemms_only and self.rearranges_group(m, mset)) for m in after_cube):
                # the conv would copy the concat's other parts; it writes its own slice in place instead
                # (ConvConcat), or the concat is read where it is consumed (a conv's or pool's input). A
                # GEMM's concat of parts of its own result (RoPE's rotate-half) copies nothing from outside.
                return "concat behind a cube op"
        reds = [m for m in members if nodes[m].locked is None and not nodes[m].cube
                and nodes[m].pattern in (REDUCE, OUT_EWISE)]
        if len(reds) > self.cfg.max_reductions:
            return f"more than {self.cfg.max_reductions} reductions"
        windowed = [m for m in reds if not nodes[m].row_norm]
        if len(windowed) > 1:
            # a pool of a pool (GoogLeNet's stage max-pool feeding the next block's 3x3/1 pool branch): each
            # window reads a halo of the other's output, so no tile of one is the input of a tile of the
            # other; the pool rule takes one pool per kernel
            wset = set(windowed)
            if any(reachable(nodes, [m], mset, "users") & wset for m in windowed):
                return "a spatial reduction (pool) feeds another in the group"
        int8_cubes = [c for c in cubes if nodes[c].int8_cube]
        if int8_cubes and any(not nodes[m].cube and nodes[m].pattern in (REDUCE, OUT_EWISE)
                              for m in reachable(nodes, int8_cubes, mset, "users")):
            # the int8 kernels keep their accumulator tile in registers and finish it with an injective
            # epilogue; a reduction behind one (a LayerNorm pattern's too, the next dynamic quantize's
            # min/max, a global pool) would put the whole kernel on a generic row rule that reads the bytes
            # unpacked, slower than the int8 kernel and the reduction apart
            return "reduction after an int8 cube op"
        if int8_cubes:
            # and they write one output: ops beside the cube (another GEMM's epilogue sharing a scale) would
            # be a second output the int8 rules do not schedule
            down = reachable(nodes, int8_cubes, mset, "users")
            tied = set(int8_cubes) | down | reachable(nodes, set(int8_cubes) | down, mset, "producers")
            if any(m not in tied for m in members):
                return "ops beside an int8 cube op (not its operand or epilogue)"
        if cubes and reds:
            after_cube = reachable(nodes, cubes, mset, "users")
            limit = self.target.l0c_bytes // (self.target.cube_m * 4)
            for m in reds:
                if m in after_cube and nodes[m].row > limit:
                    return "reduction after a cube op: row block exceeds L0C"
        return None
