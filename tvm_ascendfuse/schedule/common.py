"""Sizing, loop and vectorise helpers shared by the schedule rules.

Tile sizes come from the AscendTarget (usable UB, double buffering, 32 B alignment); vector width and
thread count come from the llvm host target, because on this host UB tiling is cache blocking.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr, normalize_prim_func

from ..ir import dtype_bytes
from ..target import AscendTarget, get_target
from ..tiling import largest_divisor, row_block  # noqa: F401  (shared with the grouping's chain costing)

get_realize = tvm_ffi.get_global_func("s_tir.schedule.GetSBlockRealize")


def new_schedule(mod) -> s_tir.Schedule:
    """A schedule of ``mod`` (an IRModule or PrimFunc) whose refused primitives say what failed in one line.

    TVM's default ("detail") renders the whole module into every ScheduleError's message; the rules try
    primitives on copies and take a refusal as "not this way" (``try_``, ``ok``), so that printing cost
    time on each refusal and, when the module mid-schedule did not print (a block iterator the printer
    cannot find, e.g. a failed tensorize of a strided staging copy), TVM wrote printer warnings to the
    user's terminal. Copies (``sch.copy()``) keep the level."""
    return s_tir.Schedule(mod, error_render_level="fast")


def as_target(target) -> AscendTarget:
    """The AscendTarget itself, or the one a name or file describes."""
    return target if isinstance(target, AscendTarget) else get_target(target)


def host_of(host):
    """The llvm host target: the one given, else the one in scope, else None (generic x86-64 assumed)."""
    if host is not None:
        return host if isinstance(host, tvm.target.Target) else tvm.target.Target(host)
    return tvm.target.Target.current(allow_none=True)


def has_feature(feature: str, host) -> bool:
    """Whether the llvm target ``host`` has this CPU feature (False off x86 or on an llvm without the query)."""
    try:
        return bool(tvm.target.codegen.target_has_features(feature, host))
    except Exception:
        return False


def vector_bits(host) -> int:
    """Width of one vector register of the target's CPU, from its features.

    Not ``llvm_get_vector_width``: it answers for the machine compiling, not for the target's ``mcpu``, so a
    ``--portable`` (SSE) or AVX2 build was sized for this machine's 512-bit vectors."""
    host = host_of(host)
    if host is None or host.kind.name != "llvm":
        return 128
    if has_feature("avx512f", host):
        return 512
    if has_feature("avx2", host) or has_feature("avx", host):
        return 256
    return 128


def vector_lanes(host, dtype_bits: int) -> int:
    """Lanes of one host vector register for this element width (16 fp32 lanes on AVX-512, 8 on AVX2)."""
    return max(1, vector_bits(host) // max(8, dtype_bits))


def num_cores(host) -> int:
    host = host_of(host)
    if host is not None and "num-cores" in host.attrs:
        return max(1, int(host.attrs["num-cores"]))
    return 1


def extent(sch: s_tir.Schedule, loop) -> int | None:
    """Static extent of a loop, None when symbolic."""
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def writes_as_many(sch: s_tir.Schedule, block, shape) -> bool:
    """Does ``block`` write exactly as many elements as a buffer of ``shape`` holds?

    An epilogue may be computed per tile of its producer only then (bias, activation, reshape, transpose).
    A block that writes more (a concatenate reading the tile in one branch of an if_then_else) gets a wrong
    region from reverse_compute_at, so such blocks must run after the producer instead."""
    def count(dims):
        n = 1
        for d in dims:
            if not isinstance(d, tirx.IntImm):
                return None
            n *= int(d)
        return n

    want = count(shape)
    return want is not None and all(count(w.source.ty.shape) == want for w in sch.get(block).writes)


def selects_by_index(sch: s_tir.Schedule, block) -> bool:
    """Does ``block`` choose between sources by its own indices (a concatenate, possibly inlined into a
    slice)? Such a block reads a producer tile only in one branch, and reverse_compute_at derives its
    region from that branch alone, so it must not be placed per tile. Value conditions (leaky_relu's
    ``x > 0``) read a buffer in the condition and are fine, also through a let-bound value (the fast-math
    exp's underflow test of a SiLU or sigmoid names only its let variable)."""
    found = []
    stmt = sch.get(block)
    iters = [iv.var for iv in stmt.iter_vars]
    lets = []
    tvm_ffi.structural_walk(stmt.body, (tirx.Let, lets.append))

    def reads(expr) -> tuple[bool, bool]:
        """(reads a buffer, names one of the block's iterators), let-bound values followed (a let's value
        cannot name its own variable, so this ends)."""
        loads, variables = [], []
        tvm_ffi.structural_walk(expr, [(tvm.ir.expr.TensorLoad, loads.append), (tvm.ir.Var, variables.append)])
        load, index = bool(loads), False
        for v in variables:
            bound = next((let.value for let in lets if let.var.same_as(v)), None)
            if bound is not None:
                sub = reads(bound)
                load, index = load or sub[0], index or sub[1]
            elif any(v.same_as(i) for i in iters):
                index = True
        return load, index

    def by_index(cond) -> bool:
        load, index = reads(cond)
        return index and not load

    def on_call(call):
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "prim.if_then_else" and by_index(call.args[0]):
            found.append(call)

    def on_select(sel):
        if by_index(sel.condition):
            found.append(sel)

    tvm_ffi.structural_walk(sch.get(block).body, [(tvm.ir.expr.Call, on_call),
                                                  (tvm.ir.prim.expr.Select, on_select)])
    return bool(found)


def tile_local(sch: s_tir.Schedule, block, shape) -> bool:
    """May ``block`` (an epilogue) be computed per tile of a producer whose output has ``shape``?"""
    return writes_as_many(sch, block, shape) and not selects_by_index(sch, block)


def vector_width_for(ext: int | None, lanes: int) -> int:
    """Largest power of two <= lanes dividing a static extent (no scalar tail inside a vector loop).
    A symbolic extent gets the full width: its tail is predicated."""
    if ext is None:
        return lanes
    v = 1
    while v * 2 <= lanes and ext % (v * 2) == 0:
        v *= 2
    return v


def buffer_bytes(buf) -> int:
    return dtype_bytes(buf.dtype)


def on_chip_bytes(buf, target, scope: str = "ub") -> int:
    """Bytes one element of ``buf`` takes on the NPU's chip: what capacity checks count (a kernel stored in
    16 bits holds its float32 tiles in 16 bits there, ``target.float_bytes``); ``buffer_bytes`` is what the
    host computes in (vector lanes)."""
    return target.element_bytes(buf.dtype, scope)


def block_infos(sch: s_tir.Schedule):
    """dlight's normal form of the function's blocks (iter kinds S/R/O per block), or None."""
    return normalize_prim_func(sch)


def root_blocks(sch: s_tir.Schedule):
    root = sch.get_sblock(sch.mod["main"].body.block.name_hint)
    return sch.get_child_blocks(root)


def is_output_block(sch: s_tir.Schedule, block) -> bool:
    """Whether the block writes a parameter buffer of the function."""
    params = [p for p in sch.mod["main"].params if isinstance(p.ty, tirx.BufferType)]
    return any(w.source.same_as(p) for w in sch.get(block).writes for p in params)


def try_(step, *args, **kwargs):
    """Run one optional schedule primitive; a ScheduleError (legality check) means 'skip this step'.
    Primitives check legality before they change the IR, so the schedule stays valid. Any other error is a
    bug and propagates."""
    try:
        return step(*args, **kwargs)
    except s_tir.ScheduleError:
        return None


def loops_through(sch: s_tir.Schedule, block, info, n_iters: int):
    """The block's loops from the outermost down to the loop of its ``n_iters``-th non-unit iterator
    (normalised infos skip unit dims; the loop nest still has them)."""
    loops = sch.get_loops(block)
    if n_iters <= 0:
        return []
    target_loop = sch.get(info.iters[n_iters - 1].loop_rv)
    for pos, loop in enumerate(loops):
        if sch.get(loop).same_as(target_loop):
            return loops[:pos + 1]
    return loops[:n_iters]


def ok(step, *args, **kwargs) -> bool:
    """Like ``try_`` for primitives that return nothing: True when the step was applied."""
    try:
        step(*args, **kwargs)
        return True
    except s_tir.ScheduleError:
        return False


# what a schedule step tried on a copy may raise besides ScheduleError (a layout or a partition TVM refuses)
TRIAL_ERRORS = (RuntimeError, ValueError, TypeError, IndexError)


def on_copy_first(sch: s_tir.Schedule, apply) -> bool:
    """``apply(sch)`` when ``apply`` succeeds on a copy of ``sch`` (returns True, raises none of
    ``TRIAL_ERRORS``); else False with ``sch`` untouched. For a chain of steps that may fail part-way."""
    try:
        if not apply(sch.copy()):
            return False
    except TRIAL_ERRORS:
        return False
    return bool(apply(sch))


def vector_storable(sch: s_tir.Schedule, block) -> bool:
    """May a loop storing this block's outputs be vectorised? Not when it writes a bool or sub-byte buffer.

    TVM's StorageRewrite retypes an allocated bool buffer whose every access is vectorised to ``int8xN`` and
    then stores those int8 vectors into bool buffers (``dtype mismatch on BufferStore ... T.int8x4``: ONNX
    And/Or/Not staged through UB); sub-byte elements have no addressable lane at all. Scalar stores of
    these types lower fine, so only the vectorisation is skipped."""
    for region in sch.get(block).writes:
        dtype = tvm.DataType(str(region.source.dtype))
        if str(region.source.dtype) == "bool" or dtype.bits < 8:
            return False
    return True


def innermost_vector(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Vectorise the innermost loop of a block by the widest legal width (no-op when none, or when the block
    stores bool/sub-byte values, see ``vector_storable``)."""
    if not vector_storable(sch, block):
        return
    loops = sch.get_loops(block)
    if not loops or not isinstance(sch.get(loops[-1]).body, s_tir.SBlockRealize):
        return          # the innermost loop also runs other blocks (an anchor loop): never vectorise it
    inner = loops[-1]
    v = vector_width_for(extent(sch, inner), lanes)
    if v < 2:
        return
    ext = extent(sch, inner)
    if ext is None:
        return   # a symbolic tail would scalarise the whole loop; leave it to LLVM's loop vectorizer
    if ext > v:
        inner = sch.split(inner, [None, v])[1]
    ok(sch.vectorize, inner)


def vectorize_inner(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Vectorise a block's innermost loop by the widest power of two dividing it (split off when shorter than
    the loop). Unlike ``innermost_vector`` it does not look at what else the loop runs: for a block whose
    innermost loop is its own (a staged copy, an epilogue placed at a tile loop)."""
    if not vector_storable(sch, block):
        return          # bool / sub-byte stores stay scalar (see vector_storable)
    loops = sch.get_loops(block)
    if not loops:
        return
    ext = extent(sch, loops[-1])
    if ext is None or ext < 2:
        return
    v = vector_width_for(ext, lanes)
    if v < 2:
        return
    inner = sch.split(loops[-1], [None, v])[1] if ext > v else loops[-1]
    try_(sch.vectorize, inner)


def parallel_vector(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Root-level injective block: parallel over the outer loops, vectorised inner loop."""
    loops = sch.get_loops(block)
    if len(loops) > 1:
        try_(sch.parallel, sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0])
    vectorize_inner(sch, block, lanes)


def has_block(sch: s_tir.Schedule, name: str) -> bool:
    """Whether a block of that name is (still) in the schedule's function."""
    try:
        sch.get_sblock(name)
        return True
    except (ValueError, RuntimeError):      # inlined away, or never there
        return False


def still_exists(sch: s_tir.Schedule, block) -> bool:
    """False once ``block`` was inlined away."""
    try:
        sch.get(block)
        return True
    except ValueError:      # "The block no longer exists in the IRModule"
        return False


def transitive_producers(sch: s_tir.Schedule, block) -> list:
    """Producer blocks of ``block`` inside the function, nearest last (compute_at order: consumers first)."""
    seen, order = set(), []

    def visit(b):
        for p in sch.get_producers(b):
            name = sch.get(p).name_hint
            if name in seen:
                continue
            seen.add(name)
            visit(p)
            order.append(p)

    visit(block)
    return order


def loop_of_reduction(sch: s_tir.Schedule, block, loop) -> bool:
    """Does ``loop`` drive a reduction iterator of ``block``?"""
    realize = get_realize(sch, block)
    name = sch.get(loop).loop_var.name
    for iv, val in zip(realize.block.iter_vars, realize.iter_values):
        if iv.iter_type == tirx.IterVar.CommReduce and name in {v.name for v in collect_vars_used_in_prim_expr(val)}:
            return True
    return False


def blocks_under(sch: s_tir.Schedule, loop) -> list:
    """The blocks nested under ``loop``, in program order."""
    found = []

    def visit(stmt):
        if isinstance(stmt, s_tir.SBlockRealize):
            found.append(stmt.block.name_hint)

    tvm_ffi.structural_walk(sch.get(loop), (s_tir.SBlockRealize, visit), order="pre")
    return [sch.get_sblock(n) for n in found]


def predicated(sch: s_tir.Schedule, block) -> bool:
    """Whether ``block`` is realized under a predicate other than constant true (a tail tile's guard)."""
    pred = get_realize(sch, block).predicate
    return not (isinstance(pred, tirx.IntImm) and int(pred) == 1)



def unwritten_output(func: tirx.PrimFunc) -> tuple[str, int, int] | None:
    """(output, iterations writing it, its elements) when the blocks writing an output of a scheduled kernel
    run fewer times in all than it has elements, else None. Some elements are then never written: TVM's
    ``reverse_compute_at`` gave a layout epilogue (a reshape with a transpose: MobileViT's unfold into 2x2
    patches) the region of part of the tile, and per-kernel checks against zeroed outputs do not see it.
    Counts only static loops (a symbolic one: not checked)."""
    params = {p: str(p.name) for p in func.params if isinstance(getattr(p, "ty", None), tirx.BufferType)}
    written: dict = {}

    def visit(stmt, count):
        if count is None:
            return
        if isinstance(stmt, tirx.For):
            ext = stmt.extent
            visit(stmt.body, count * int(ext) if isinstance(ext, tirx.IntImm) else None)
        elif isinstance(stmt, s_tir.SBlockRealize):
            for w in stmt.block.writes:
                volume = 1          # a block writing a region per iteration (a tensorized one): its elements
                for rg in w.region:
                    volume = volume * int(rg.extent) if isinstance(rg.extent, tirx.IntImm) and volume else None
                for p in params:
                    if w.source.same_as(p):
                        written[p] = None if volume is None or written.get(p, 0) is None else \
                            written.get(p, 0) + count * volume
            visit(stmt.block.body, count)
        elif isinstance(stmt, tirx.SeqStmt):
            for child in stmt.seq:
                visit(child, count)
        else:
            for attr in ("body", "then_case", "else_case"):
                child = getattr(stmt, attr, None)
                if isinstance(child, tirx.Stmt):
                    visit(child, count)

    visit(func.body, 1)
    for p, n in written.items():
        dims = p.ty.shape
        if n is None:
            continue
        if all(isinstance(d, tirx.IntImm) for d in dims):
            size = 1
            for d in dims:
                size *= int(d)
            if n < size:
                return params[p], n, size
    return None


def substitute_vars(expr, pairs):
    """``expr`` with each variable of ``pairs`` ((var, value), ...) replaced by its value (TVM 0.27's Python
    has no substitute for expressions); a plain int is returned as it is."""
    if isinstance(expr, int):
        return expr

    def on_var(v):
        return next((e for x, e in pairs if v.same_as(x)), v)

    return tvm_ffi.structural_map(expr, (tvm.ir.Var, on_var))


def register_intrin_once(name: str, make) -> str:
    """Register tensor intrinsic ``name`` from ``make() -> (desc, impl)`` unless this process already has it;
    returns the name. The rules register theirs on first use: parsing them at import cost every process
    (the CLI, each test and tuning worker) about a second per intrinsic module."""
    try:
        s_tir.TensorIntrin.get(name)
    except ValueError:      # not registered yet
        s_tir.TensorIntrin.register(name, *make())
    return name
