"""One kernel: search its rule's tunable space, then check the fastest candidates side by side with the
rule's default and record only what beats it.

MetaSchedule's own pieces (TuneContext, ReplayFunc, builder/runners, databases), driven by a short loop
instead of its task scheduler: the scheduler estimates every task's FLOPs first, and that estimator has no
case for the ``Let`` expressions of our fast exp/erf (``InternalError: Do not have a default for
prim.Let``), so any kernel with a GELU/SiLU epilogue could not be tuned through it. The loop also lets a
search stop at a deadline and continue in a later run from the candidates already measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import tvm

from ..schedule.tuned import tile_decision
from ..target import AscendTarget
from .kernels import Kernel
from .measure import args_of, last_line

# Fraction by which a tuned schedule must beat the rule's default (re-timed side by side) to be recorded.
MIN_GAIN = 0.03

_ALL = 1 << 30   # get_top_k without a limit


@dataclass
class SearchOutcome:
    measured: int          # candidates measured for this kernel, earlier runs included
    failed: int            # of those, how many produced no time (build or run error, lost RPC session)
    stopped: bool          # the deadline cut the search short
    first_error: str = ""  # last line of the first error, for the report


def search_kernel(kernel: Kernel, npu: AscendTarget, host, trials: int | None, database, measure, seed: int,
                  state: dict, deadline: float | None = None, batch: int = 8, on_batch=None,
                  clock=time.monotonic) -> SearchOutcome:
    """Measure candidates of ``kernel``'s space until ``trials`` were measured in all (``state`` holds an
    earlier run's counts; None: each candidate of the space once) or the ``deadline`` (on ``clock``) is
    near: a next batch is started only when it and the side-by-side check (estimated as one batch each) fit.
    Measured candidates go to ``database``; ``on_batch(state, measured_now, best_us)`` after every batch."""
    from tvm.s_tir import meta_schedule as ms

    from ..schedule.tunable import LeastDrawnTiles, space_generator

    chooser = LeastDrawnTiles()
    ctx = tune_context(kernel.workload, host, space_generator(kernel.rule, npu, host, chooser), kernel.name,
                       seed, measure.cores)
    workload = database.commit_workload(kernel.workload)
    spaces = ctx.generate_design_space()        # runs the space once: enumerates what the rule accepts
    cap = trials if trials is not None else len(chooser.allowed or ())
    earlier = list(database.get_top_k(workload, _ALL))
    for r in earlier:                           # a resumed search draws what it has not measured yet
        d = tile_decision(r)
        if d is not None and d < len(chooser.candidates):
            t = chooser.candidates[d]
            chooser.drawn[t] = chooser.drawn.get(t, 0) + 1
    measured, failed = state["measured"], state["failed"]
    outcome = SearchOutcome(measured, failed, False)
    if measured >= cap:
        return outcome
    ctx.pre_tuning(max_trials=cap - measured, num_trials_per_iter=min(batch, cap - measured),
                   design_spaces=spaces, database=database)
    last_batch = 0.0
    ran = False
    try:
        while measured < cap:
            if deadline is not None and ran and clock() + 2 * last_batch > deadline:
                outcome.stopped = True
                break
            started = clock()
            candidates = ctx.generate_measure_candidates()
            if not candidates:
                break
            candidates = list(candidates)[: cap - measured]
            outcomes, lost = [], 0
            for c, (secs, error) in zip(candidates, measure([(c.sch.mod, c.args_info) for c in candidates])):
                outcomes.append(ms.runner.RunnerResult(None if secs is None else [secs], error))
                if error is not None:
                    lost += 1
                    if not outcome.first_error:
                        outcome.first_error = last_line(error)
                else:
                    database.commit_tuning_record(ms.database.TuningRecord(
                        c.sch.trace, workload, [secs], host, c.args_info))
            ctx.notify_runner_results(candidates, outcomes)
            measured += len(candidates)
            failed += lost
            state.update(measured=measured, failed=failed)
            ran = True
            last_batch = clock() - started
            if on_batch is not None:
                on_batch(state, len(candidates), best_us(database, kernel))
    finally:
        ctx.post_tuning()
    outcome.measured, outcome.failed = measured, failed
    return outcome


def confirm_kernel(kernel: Kernel, npu: AscendTarget, host, searched, database, measure, finalists: int = 3,
                   rounds: int = 3) -> str | None:
    """Time the rule's default and the ``finalists`` fastest distinct searched tiles side by side (``rounds``
    interleaved runs, one candidate at a time, fastest kept) and commit to ``database`` the default and what
    beats it by ``MIN_GAIN``. Returns None, or why nothing was recorded (the kernel then counts as not yet
    tuned, and a rerun checks it again).

    The search alone ranks candidates measured minutes apart; on a shared machine that ranks the load as
    much as the tiles (seen: a block 15% slower than the default recorded as 3x faster). Only the
    side-by-side numbers reach the database, so a record beats the default only where it did so measured
    next to it. The default is built fresh from the rule: it is compared even when its own search
    measurement was lost."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from ..schedule.tunable import default_schedule

    default = default_schedule(kernel.workload, kernel.rule, npu, host)
    picks = [(0, default.trace, default.mod, args_of(default.mod))]
    seen = {0}
    for r in searched.get_top_k(searched.commit_workload(kernel.workload), _ALL):
        d = tile_decision(r)
        if d in seen or len(picks) > finalists:
            continue
        seen.add(d)
        sch = s_tir.Schedule(kernel.workload)
        r.trace.apply_to_schedule(sch, remove_postproc=False)
        picks.append((d, r.trace, sch.mod, r.args_info))
    timed = measure([(mod, args) for _, _, mod, args in picks], rounds=rounds, serial=True)
    if timed[0][0] is None:
        return f"the default could not be timed beside the others ({last_line(timed[0][1])}): nothing recorded"
    workload = database.commit_workload(kernel.workload)
    keep = worth_recording([(d, secs, (d, trace, args)) for (d, trace, _, args), (secs, _) in zip(picks, timed)
                            if secs is not None])
    # the default last: a kernel counts as tuned once it has records, so a run killed between the commits
    # must not leave the default alone (that would skip a winner for good); a winner alone still beat it
    for (_, trace, args), secs in sorted(keep, key=lambda rs: rs[0][0] == 0):
        database.commit_tuning_record(ms.database.TuningRecord(trace, workload, [secs], host, args))
    return None


def worth_recording(timed: list[tuple], min_gain: float | None = None) -> list[tuple]:
    """``(record, secs)`` of ``(decision, secs, record)`` timings worth committing: the default (decision 0)
    and picks that beat it by ``min_gain``; on a busy machine a burst of load during the default's rounds
    once made a 16-21% slower block look 19% faster. Without a default timing, nothing: a pick is recorded
    only when it beat the default measured next to it."""
    min_gain = MIN_GAIN if min_gain is None else min_gain
    base = next((secs for d, secs, _ in timed if d == 0), None)
    if base is None:
        return []
    return [(r, secs) for d, secs, r in timed if d == 0 or secs < base * (1.0 - min_gain)]


def tune_context(mod: tvm.IRModule, host, space, task_name: str, seed: int, cores: int):
    """``ms.TuneContext(...)`` without its ``import tvm.s_tir.tensor_intrin`` (about a minute of CPU for
    tensor intrinsics our rules never use); the same FFI constructor and initialisation otherwise."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.meta_schedule.logging import get_logger, get_logging_func

    ctx = ms.TuneContext.__new__(ms.TuneContext)
    ctx.__init_handle_by_constructor__(_ffi_api.TuneContext, mod, host, space, ms.search_strategy.ReplayFunc(),
                                       task_name, cores, seed, get_logging_func(get_logger("tvm_ascendfuse.tune")))
    _ffi_api.TuneContextInitialize(ctx)
    return ctx


def kernel_records(database, kernel: Kernel) -> list:
    if not database.has_workload(kernel.workload):
        return []
    return list(database.get_top_k(database.commit_workload(kernel.workload), _ALL))


def best_us(database, kernel: Kernel) -> float | None:
    times = [t for t in map(record_us, kernel_records(database, kernel)) if t is not None]
    return min(times) if times else None


def default_and_best(database, kernel: Kernel) -> tuple[float | None, float | None, str]:
    """The default's time, the best time and the best record's tiles, from a kernel's records."""
    timed = [(r, record_us(r)) for r in kernel_records(database, kernel)]
    timed = [(r, t) for r, t in timed if t is not None]
    default = [t for r, t in timed if tile_decision(r) == 0]
    best = min(timed, key=lambda rt: rt[1]) if timed else None
    return (min(default) if default else None, best[1] if best else None, tiles_note(best[0]) if best else "")


def record_us(record) -> float | None:
    secs = [float(s) for s in (record.run_secs or [])]
    if not secs or any(s >= 1e9 for s in secs):         # MetaSchedule marks failed runs with 1e10
        return None
    return 1e6 * sum(secs) / len(secs)


def tiles_note(record) -> str:
    for inst in record.trace.insts:
        if inst.kind.name == "Annotate" and len(inst.attrs) and str(inst.attrs[0]) == "ascendfuse.schedule":
            return str(inst.inputs[-1]).strip('"')
    return f"candidate {tile_decision(record)}"


