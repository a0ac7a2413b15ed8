"""A bound on the code a scheduled kernel asks LLVM to generate: what unrolling and vector width multiply.

LLVM's time grows with the code it is given, faster than linearly for very wide vectors: a loop vectorised
``n`` lanes wide is one ``<n x float>`` operation per statement, which instruction selection splits into
``n / lanes`` register operations and legalises slowly. A schedule that vectorised a whole 384-wide output row
of a GEMM (with a LayerNorm and an erf inlined into it) took 20-70 s of LLVM time per kernel on
convnext_tiny, against 0.3 s with vectors of one register. Unrolling multiplies a body the same way.

``bound_code_size`` runs on every scheduled kernel (``apply.py``), whichever rule made it:

* a vectorised loop wider than ``MAX_VECTOR_REGISTERS`` host registers is split so that the vectorised part is
  one register wide (the rest a serial loop; the loop stays serial when TVM refuses to vectorise the
  split part);
* the *unrolled size* of a loop nest is counted: a statement's expression nodes, times the extent of every
  unrolled loop around it and the registers of every vectorised one. Where it exceeds ``MAX_UNROLLED_NODES``,
  the outermost unrolled loops are turned back into serial loops (innermost unrolls, the register block, are
  kept) until it does not.

Both are semantics-preserving (a loop's kind only says how it is emitted). What was changed is returned as
notes for the report (``schedule_notes``).
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from .common import new_schedule, vector_lanes

# A vector loop of at most this many host registers is left as the rule made it (a rule's register block
# vectorises one; an epilogue row of a few is harmless).
MAX_VECTOR_REGISTERS = 4
# Expression nodes one unrolled nest may expand to: 4x the largest nest the rules make on the workloads and
# public models (a 7x7 stem conv's register block with its window columns unrolled: ~8000; GEMM micro-kernels
# ~1000).
MAX_UNROLLED_NODES = 32768

_SERIAL, _UNROLLED, _VECTORIZED = tirx.ForKind.SERIAL, tirx.ForKind.UNROLLED, tirx.ForKind.VECTORIZED


def _extent(loop) -> int | None:
    return int(loop.extent) if isinstance(loop.extent, tirx.IntImm) else None


def _nodes(stmt) -> int:
    """Expression nodes of a leaf statement's value: the operations it emits (a store's value, an evaluated
    call); block signatures and index arithmetic (simplified or hoisted by LLVM) are not counted."""
    value = getattr(stmt, "value", None)
    if value is None:
        return 1
    count = [1]

    def one(_):
        count[0] += 1

    tvm_ffi.structural_walk(value, one)
    return count[0]


def _children(stmt) -> list | None:
    """The statements directly inside ``stmt``; None for a leaf (a store, an evaluation)."""
    if isinstance(stmt, tirx.For):
        return [stmt.body]
    if isinstance(stmt, tirx.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        return [stmt.block]
    if isinstance(stmt, s_tir.SBlock):
        return [stmt.body] + ([stmt.init] if stmt.init is not None else [])
    if isinstance(stmt, tirx.IfThenElse):
        return [stmt.then_case] + ([stmt.else_case] if stmt.else_case is not None else [])
    if isinstance(stmt, (tirx.AttrStmt, tirx.While)):
        return [stmt.body]
    return None


def unrolled_size(stmt, lanes: int) -> int:
    """Expression nodes ``stmt`` expands to once unrolled loops are replicated and vector loops split into
    ``lanes``-wide registers."""
    kids = _children(stmt)
    if kids is None:
        return _nodes(stmt)
    inner = sum(unrolled_size(k, lanes) for k in kids)
    if isinstance(stmt, tirx.For):
        n = _extent(stmt) or 1
        if stmt.kind == _UNROLLED:
            return n * inner
        if stmt.kind == _VECTORIZED:
            return math.ceil(n / lanes) * inner
    return inner


def _serial(loop):
    return tirx.For(loop.loop_var, loop.min, loop.extent, _SERIAL, loop.body, loop.thread_binding,
                    loop.annotations)


def _narrow_vectors(func: tirx.PrimFunc, lanes: int, notes: list) -> tirx.PrimFunc:
    """Split every vectorised loop wider than ``MAX_VECTOR_REGISTERS`` registers into a serial loop over one
    vectorised register."""
    wide = []
    tvm_ffi.structural_walk(func.body, (tirx.For, lambda f: wide.append(f) if f.kind == _VECTORIZED and (
        _extent(f) or 0) > MAX_VECTOR_REGISTERS * lanes else None))
    if not wide:
        return func
    names = {f.loop_var.name for f in wide}
    try:
        sch = new_schedule(tvm.IRModule({"main": func}))
        blocks = []
        tvm_ffi.structural_walk(sch.mod["main"].body, (s_tir.SBlock, lambda b: blocks.append(b.name_hint)))
        done = set()
        for name in blocks:
            block = sch.get_sblock(name)
            for loop in sch.get_loops(block):
                st = sch.get(loop)
                key = st.loop_var.name
                if key in names and key not in done and st.kind == _VECTORIZED:
                    done.add(key)
                    n = _extent(st)
                    width = lanes if n % lanes == 0 else 1
                    if width > 1:
                        _, inner = sch.split(loop, [None, width])
                        try:
                            sch.vectorize(inner)
                        except s_tir.ScheduleError:
                            pass            # stays a serial loop: correct, LLVM may still vectorise it
                    notes.append(f"vector loop of {n} lanes split into {width}-lane vectors (code size)")
        out = sch.mod["main"]
    except (s_tir.ScheduleError, RuntimeError, ValueError):   # TVM raises RuntimeError subclasses
        out = func
    # whatever the schedule could not reach (or split) is emitted as a serial loop
    left = []

    def demote(f):
        if f.kind == _VECTORIZED and (_extent(f) or 0) > MAX_VECTOR_REGISTERS * lanes:
            left.append(f.loop_var.name)
            return _serial(f)
        return f

    out = tvm_ffi.structural_map(out, (tirx.For, demote), order="post")
    if left:
        notes.append(f"vector loops {sorted(set(left))} emitted serially (code size)")
    return out


def _bound_unrolling(func: tirx.PrimFunc, lanes: int, notes: list) -> tirx.PrimFunc:
    """Outermost unrolled loops of nests whose unrolled size exceeds ``MAX_UNROLLED_NODES`` made serial."""
    demoted = []

    def visit(f):
        # post order: inner loops were already bounded, so only this level can push the nest over the cap
        if f.kind == _UNROLLED and unrolled_size(f, lanes) > MAX_UNROLLED_NODES:
            demoted.append((f.loop_var.name, _extent(f)))
            return _serial(f)
        return f

    out = tvm_ffi.structural_map(func, (tirx.For, visit), order="post")
    if demoted:
        notes.append(f"unrolled loops {demoted} emitted as loops: their nests expanded to more than "
                     f"{MAX_UNROLLED_NODES} expression nodes (code size)")
    return out


def bound_code_size(func: tirx.PrimFunc, host) -> tuple[tirx.PrimFunc, list[str]]:
    """(``func`` with its vector widths and unrolling bounded, notes on what changed)."""
    if not isinstance(func, tirx.PrimFunc):
        return func, []
    lanes = max(1, vector_lanes(host, 32))
    notes: list[str] = []
    func = _narrow_vectors(func, lanes, notes)
    func = _bound_unrolling(func, lanes, notes)
    return func, notes
