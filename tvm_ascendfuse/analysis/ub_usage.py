"""On-chip buffer use of scheduled kernels, counted on the TIR that will be built.

A kernel's footprint per scope (``local.UB``, ``local.L1``, ``local.L0A/B/C``) is the sum of its
allocations in that scope after ``CompactBufferAllocation`` has shrunk each buffer to the region one
iteration of its enclosing loop touches (the tile), each rounded up to the scope's alignment as the NPU's
allocator would. All allocations are counted as live at once (conservative). The compacted shapes are read
from the opaque blocks' allocations right after compaction (no further lowering), and ``kernel_usages``
runs that once for a whole module.

Bare ``ub``/``l1``/``l0a``/``l0b``/``l0c`` scopes in hand-written TIR are aliases: TVM rejects a scope
without a rank, so they are rewritten to ``local.<NAME>`` before scheduling and lowering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ..precision.on_chip import kernel_target
from ..target import AscendTarget

ON_CHIP_SCOPES = ("local.UB", "local.L1", "local.L0A", "local.L0B", "local.L0C")
SCOPE_ALIASES = {"ub": "local.UB", "l1": "local.L1", "l0a": "local.L0A", "l0b": "local.L0B", "l0c": "local.L0C",
                 "local.ub": "local.UB", "local.l1": "local.L1", "local.l0a": "local.L0A",
                 "local.l0b": "local.L0B", "local.l0c": "local.L0C"}
_ALIGN_KEY = {"local.UB": "ub", "local.L1": "l1", "local.L0A": "l0a", "local.L0B": "l0b", "local.L0C": "l0c"}


def canonical_scope(scope: str) -> str:
    return SCOPE_ALIASES.get(scope, SCOPE_ALIASES.get(scope.lower(), scope)) if scope else scope


def normalize_scope_aliases(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every buffer in an alias scope (``ub``, ...) moved to its canonical ``local.*`` scope."""
    found = []
    tvm_ffi.structural_walk(func, (tvm.ir.Var, lambda v: found.append(v) if isinstance(v.ty, tirx.BufferType)
                                   and v.ty.storage_scope in SCOPE_ALIASES else None))
    if not found:
        return func
    memo = {}

    def on_var(v):
        t = v.ty
        if isinstance(t, tirx.BufferType) and t.storage_scope in SCOPE_ALIASES:
            if v not in memo:
                memo[v] = tvm.ir.Var(v.name, tirx.BufferType(
                    t.dtype, SCOPE_ALIASES[t.storage_scope], t.shape, t.strides, t.elem_offset, t.data_alignment,
                    t.offset_factor, t.layout, t.allocated_addr))
            return memo[v]
        return v

    return tvm_ffi.structural_map(func, (tvm.ir.Var, on_var))


_COMPACT = None


def _compact_pipeline():
    """The lowering steps up to buffer compaction (the same ones the TIR build runs first)."""
    global _COMPACT
    if _COMPACT is None:
        _COMPACT = tvm.transform.Sequential([
            s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
            s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation()])
    return _COMPACT


@dataclass
class Allocation:
    name: str
    scope: str
    nbytes: int | None      # None: symbolic size
    aligned: int | None


@dataclass
class KernelUsage:
    kernel: str
    allocations: list[Allocation] = field(default_factory=list)

    def bytes(self, scope: str) -> int:
        """Aligned bytes in a scope (symbolic allocations excluded; see ``symbolic``)."""
        return sum(a.aligned or 0 for a in self.allocations if a.scope == scope)

    def raw_bytes(self, scope: str) -> int:
        return sum(a.nbytes or 0 for a in self.allocations if a.scope == scope)

    def symbolic(self, scope: str) -> list[str]:
        return [a.name for a in self.allocations if a.scope == scope and a.nbytes is None]

    def unaligned(self, scope: str) -> list[str]:
        """Allocations whose size is not a multiple of the scope alignment (padded by the allocator)."""
        return [a.name for a in self.allocations if a.scope == scope and a.nbytes is not None
                and a.aligned != a.nbytes]


@dataclass(frozen=True)
class Overflow:
    """A kernel's on-chip bytes in one scope above what the target has."""

    kernel: str
    scope: str
    needed: int
    available: int

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "scope": self.scope, "needed_bytes": self.needed,
                "available_bytes": self.available}


def first_overflow(usage: KernelUsage, target: AscendTarget) -> Overflow | None:
    """The first on-chip scope (UB, L1, L0A/B/C) a kernel's allocations exceed, else None."""
    for scope in ON_CHIP_SCOPES:
        needed = usage.bytes(scope)
        if needed > target.capacity(scope):
            return Overflow(usage.kernel, scope, needed, target.capacity(scope))
    return None


def _static(e) -> int | None:
    return int(e) if isinstance(e, tirx.IntImm) else None


def kernel_usage(name: str, func: tirx.PrimFunc, target: AscendTarget) -> KernelUsage:
    """On-chip allocations of one kernel after buffer compaction."""
    return kernel_usages({name: func}, target)[name]


def kernel_usages(funcs: dict, target: AscendTarget) -> dict[str, KernelUsage]:
    """``{name: KernelUsage}`` for ``{name: PrimFunc}``, compacted together in one module (one pass run)."""
    prepared = {}
    for name, func in funcs.items():
        func = normalize_scope_aliases(func)
        if "global_symbol" not in (func.attrs or {}):
            func = func.with_attr("global_symbol", name)
        prepared[name] = func
    if not prepared:
        return {}
    compacted = _compact_pipeline()(tvm.IRModule(prepared))
    return {name: _usage_of(name, compacted[name], target) for name in prepared}


def _usage_of(name: str, func: tirx.PrimFunc, target: AscendTarget) -> KernelUsage:
    usage = KernelUsage(name)
    # a kernel a precision mode stores in 16 bits holds its float32 tiles in 16 bits on the NPU (its mark)
    target = kernel_target(target, func)

    def count(buf):
        scope = canonical_scope(buf.scope())
        if scope not in ON_CHIP_SCOPES:
            return
        dims = [_static(d) for d in buf.shape]
        elem = target.element_bytes(buf.dtype, scope)
        nbytes = None if any(d is None for d in dims) else math.prod(dims) * elem
        aligned = None if nbytes is None else target.align_up(nbytes, _ALIGN_KEY[scope])
        usage.allocations.append(Allocation(buf.name, scope, nbytes, aligned))

    def on_block(block):
        for buf in block.alloc_buffers:
            count(buf)

    # allocations stay on their (opaque) blocks after compaction; an AllocBuffer only in hand-lowered TIR
    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, on_block), (tirx.AllocBuffer, lambda a: count(a.buffer))],
                            order="pre")
    return usage


def module_usage(mod: tvm.IRModule, target: AscendTarget) -> dict[str, KernelUsage]:
    return kernel_usages({gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)},
                         target)
