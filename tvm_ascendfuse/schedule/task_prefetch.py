"""Prefetch per parallel task: the memory streams of a kernel's next task overlap this task's arithmetic.

A conv or GEMM kernel scheduled by our rules runs one parallel loop of tasks (a block of output channels
over a small plane, say). Each task reads a contiguous run of lines no other task reads: its block of the
packed weights, and in the epilogue its part of a residual. Inside a whole model these come from memory
(ResNet-50's 102 MB of weights, activations written two kernels ago), and the hardware prefetcher only sees a
stream once the task reads it: the task first stalls on the weights, computes, then stalls again on the
residual in its epilogue. Measured inside ResNet-50 on a 2-core Zen 5, the 1x1 conv 256 -> 1024 + residual on
14x14 ran 0.29 ms a call where alone (caches warm) it ran 0.22, and onnxruntime's node 0.24.

This pass inserts, in each task, software prefetches (``llvm.prefetch``, into L2) of
- the weight lines the *next* task will read (a stream read by the kernel's reduction block), and
- the lines the task's own epilogue will read of another input (a residual),
spread over the iterations of the loops between the task loop and the register block's reduction loops, a
few lines an iteration, so the requests trickle out while the FMAs run. Nothing inside the register block's
reduction loop: a call there made LLVM keep the accumulators in memory (measured 2.5x slower).

A stream qualifies when the lines a task reads are one contiguous run and the next task's run is that run
shifted past its end (evaluated with numpy over the loops the load's indices use, for tasks 0 and 1; a
symbolic or unevaluable index is left alone). Runs of strided rows (an NCHW row read over many channels)
are not prefetched: measured slower on ResNet-50's 56x56 and 28x28 kernels (the hardware prefetcher already
follows them). A prefetch is a hint; the addresses are clamped into the buffer, so the last task's prefetch
of a "next" task reads nothing out of bounds.

Runs after the verification phase (``pipeline.py``): the scheduled module the report and the structural
checks see has no prefetches; the switch ``TaskPrefetch`` turns the pass off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ..ir import dtype_bytes
from ..kinds import uses_var
from ..passbase import PyPass
from ..switches import TASK_PREFETCH
from .common import substitute_vars
from .row_blocks import MAX_POINTS, evaluate_index

LINE_BYTES = 64
MIN_LINES = 8            # shorter streams (a bias) are not worth the instructions
MAX_LINES = 1 << 13      # a task's run beyond 512 KB: more than L2 holds beside the task's own data
MAX_GROUP = 64           # consecutive tasks sharing a stream looked for (rows of a channel block)
LOCALITY_L2 = 2          # llvm.prefetch locality: 2 = prefetcht1 on x86 (into L2)


@dataclass(frozen=True)
class Stream:
    """Lines ``first + (task // group) * step + [0, count)`` of ``buffer``: ``group`` consecutive tasks read
    the same lines (the rows of one block of output channels). ``next_task``: a task prefetches its share
    (1 / ``group``) of the lines of the next group (of the next task when ``group`` is 1); else its own."""

    buffer: object
    first: int
    count: int
    step: int
    next_task: bool
    group: int = 1

    def describe(self) -> str:
        whose = "own epilogue" if not self.next_task else "next task" if self.group == 1 else \
            f"next block of {self.group} tasks"
        return f"{self.buffer.name} ({self.count} lines, {whose})"


def _blocks_under(stmt, chain=()):
    """(realize, loops between ``stmt`` and it) of every block realize under ``stmt``, in program order."""
    if isinstance(stmt, s_tir.SBlockRealize):
        return [(stmt, list(chain))] + _blocks_under(stmt.block.body, chain)
    if isinstance(stmt, tirx.For):
        return _blocks_under(stmt.body, chain + (stmt,))
    if isinstance(stmt, tirx.SeqStmt):
        return [found for s in stmt.seq for found in _blocks_under(s, chain)]
    found = []
    for attr in ("body", "then_case", "else_case"):
        if getattr(stmt, attr, None) is not None:
            found += _blocks_under(getattr(stmt, attr), chain)
    return found


def _task_lines(realize, loops, load, task_var, task: int):
    """Sorted distinct lines of ``load`` (in ``realize`` under ``loops``) that task ``task`` reads, or None."""
    bind = list(zip([iv.var for iv in realize.block.iter_vars], realize.iter_values))
    indices = [substitute_vars(i, bind) for i in load.indices]
    used = [f for f in loops if any(uses_var(i, f.loop_var) for i in indices)]
    if any(not isinstance(f.extent, tirx.IntImm) or not isinstance(f.min, tirx.IntImm) for f in used):
        return None
    extents = [int(f.extent) for f in used]
    if math.prod(extents) > MAX_POINTS:
        return None
    grids = np.meshgrid(*[np.arange(e, dtype=np.int64) + int(f.min) for e, f in zip(extents, used)],
                        indexing="ij") if used else []
    env = {f.loop_var.name: g.reshape(-1) for f, g in zip(used, grids)}
    env[task_var.name] = np.int64(task)
    shape = load.source.ty.shape
    if any(not isinstance(d, tirx.IntImm) for d in shape):
        return None
    flat = np.int64(0)
    for index, dim in zip(indices, shape):
        value = evaluate_index(index, env)
        if value is None:
            return None
        flat = flat * int(dim) + value
    nbytes = dtype_bytes(str(load.source.ty.dtype))
    return np.unique(np.asarray(flat, dtype=np.int64) * nbytes // LINE_BYTES)


def _stream(realize, loops, load, task_var, tasks: int, next_task: bool) -> Stream | None:
    a = _task_lines(realize, loops, load, task_var, 0)
    if a is None or not MIN_LINES <= len(a) <= MAX_LINES or int(a[-1] - a[0]) + 1 != len(a):
        return None            # not one contiguous run
    group, b = 1, _task_lines(realize, loops, load, task_var, 1)
    # tasks sharing the run (a weight block read by each of its rows' tasks): the reduction's stream only
    while next_task and b is not None and np.array_equal(a, b) and group < min(MAX_GROUP, tasks - 1):
        group += 1
        b = _task_lines(realize, loops, load, task_var, group)
    if b is None or len(b) != len(a):
        return None
    step = int(b[0] - a[0])
    if step < len(a) or not np.array_equal(b - step, a):
        return None            # overlapping the next task's (or group's) lines
    return Stream(load.source, int(a[0]), len(a), step, next_task, group)


def plan_streams(func: tirx.PrimFunc):
    """(parallel task loop, the reduction block's (realize, loops), streams) of a kernel whose one parallel
    loop holds one reduction block, or None."""
    params = [p for p in func.params if isinstance(p.ty, tirx.BufferType)]
    parallel = []
    tvm_ffi.structural_walk(func.body, (tirx.For, lambda f: parallel.append(f)
                                        if f.kind == tirx.ForKind.PARALLEL else None))
    if len(parallel) != 1 or not isinstance(parallel[0].extent, tirx.IntImm) or int(parallel[0].extent) < 2:
        return None
    task = parallel[0]
    blocks = _blocks_under(task.body)
    reductions = [i for i, (r, _) in enumerate(blocks)
                  if any(int(iv.iter_type) == int(tirx.IterVar.CommReduce) for iv in r.block.iter_vars)]
    if len(reductions) != 1:
        return None
    red = reductions[0]
    written = {w.source.name for r, _ in blocks for w in r.block.writes}
    streams, seen = [], set()
    for i, (realize, loops) in enumerate(blocks):
        if i < red:
            continue
        loads = []
        tvm_ffi.structural_walk(realize.block.body, (tvm.ir.expr.TensorLoad, loads.append))
        for load in loads:
            buf = load.source
            if buf.name in seen or buf.name in written or not any(buf.same_as(p) for p in params):
                continue
            stream = _stream(realize, loops, load, task.loop_var, int(task.extent), next_task=i == red)
            if stream is not None:
                seen.add(buf.name)
                streams.append(stream)
    return (task, blocks[red], streams) if streams else None


def _register_block_outer_loops(red):
    """The loops between the task loop and the reduction block's last run of reduction loops (the register
    block's own reduction, whose body keeps the accumulators in registers), or None."""
    realize, loops = red
    values = [v for iv, v in zip(realize.block.iter_vars, realize.iter_values)
              if int(iv.iter_type) == int(tirx.IterVar.CommReduce)]
    reducing = [any(uses_var(v, f.loop_var) for v in values) for f in loops]
    if not any(reducing):
        return None
    first = max(i for i, r in enumerate(reducing) if r)
    while first > 0 and reducing[first - 1]:
        first -= 1
    outer = loops[:first]
    if any(not isinstance(f.extent, tirx.IntImm) for f in outer):
        return None
    return outer


def _prefetch(buf, line):
    """``llvm.prefetch`` (read, into L2, data cache) of line ``line`` of ``buf``."""
    shape = [int(d) for d in buf.ty.shape]
    per_line = max(1, LINE_BYTES // dtype_bytes(str(buf.ty.dtype)))
    flat = line * tirx.IntImm("int64", per_line)
    index = []
    for dim in reversed(shape):
        index.append(tirx.FloorMod(flat, tirx.IntImm("int64", dim)))
        flat = tirx.FloorDiv(flat, tirx.IntImm("int64", dim))
    address = tirx.call_intrin("handle", "tirx.address_of", tirx.BufferLoad(buf, list(reversed(index))))
    return tirx.Evaluate(tirx.call_llvm_intrin("void", "llvm.prefetch.p0", address, tirx.IntImm("int32", 0),
                                               tirx.IntImm("int32", LOCALITY_L2), tirx.IntImm("int32", 1)))


def insert_prefetches(func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, list[Stream]]:
    """``func`` with its task streams prefetched (module docstring), and the streams; ``func`` and [] when
    it has none."""
    plan = plan_streams(func)
    if plan is None:
        return func, []
    task, red, streams = plan
    outer = _register_block_outer_loops(red)
    if outer is None:
        return func, []
    i64 = lambda v: tirx.IntImm("int64", v)   # noqa: E731
    iterations = math.prod(int(f.extent) for f in outer)
    step = i64(0)
    for f in outer:
        step = step * i64(int(f.extent)) + (f.loop_var - f.min)
    stmts = []
    t = task.loop_var
    for s in streams:
        share = -(-s.count // s.group)                       # lines of the next group's run per task
        per = -(-share // iterations)
        block = tirx.FloorDiv(t, i64(s.group)) + (i64(1) if s.next_task else i64(0))
        start = tirx.FloorMod(t, i64(s.group)) * i64(share)
        lines = int(math.prod(int(d) for d in s.buffer.ty.shape)) * dtype_bytes(str(s.buffer.ty.dtype))
        last = max(0, -(-lines // LINE_BYTES) - 1)
        j = tirx.Var("prefetch_j", "int64")
        k = step * i64(per) + j
        line = tirx.Min(i64(s.first) + block * i64(s.step) + start + k, i64(last))
        body = tirx.IfThenElse(tirx.And(k < i64(share), start + k < i64(s.count)), _prefetch(s.buffer, line), None)
        stmts.append(tirx.For(j, i64(0), i64(per), tirx.ForKind.UNROLLED if per <= 8 else tirx.ForKind.SERIAL,
                              body))
    at = outer[-1] if outer else task

    def on_for(f):
        if f.same_as(at):
            return tirx.For(f.loop_var, f.min, f.extent, f.kind, tirx.SeqStmt(stmts + [f.body]), f.thread_binding,
                            f.annotations)
        return f

    return tvm_ffi.structural_map(func, (tirx.For, on_for)), streams


class TaskPrefetch(PyPass):
    """Module pass: every scheduled kernel's per-task streams prefetched (module docstring); the kernels and
    their streams go into the report's ``task_prefetch`` section."""

    def __init__(self, report=None):
        self.report = report

    def pass_name(self) -> str:
        return TASK_PREFETCH

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        done = {}
        mod = mod.clone()           # the phase before keeps its module (the report's scheduled module)
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, tirx.PrimFunc) or func.attrs is None or "tirx.is_scheduled" not in func.attrs:
                continue
            new, streams = insert_prefetches(func)
            if streams:
                mod[gv] = new
                done[gv.name_hint] = [s.describe() for s in streams]
        if self.report is not None and done:
            self.report.sections["task_prefetch"] = done
        return mod
