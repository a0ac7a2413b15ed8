"""The code-size guard (``code_size.py``): wide vector loops are cut to register-wide vectors and unrolled
nests that would expand past ``MAX_UNROLLED_NODES`` are emitted as loops; the kernel computes the same."""

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from tests.helpers import assert_close, tol
from tests.schedule.kernels import HOST, fused_kernel
from tvm_ascendfuse.schedule import code_size
from tvm_ascendfuse.schedule.code_size import MAX_UNROLLED_NODES, bound_code_size, unrolled_size


def _kernel(rows, cols):
    return fused_kernel(lambda x, y: relax.op.tanh(relax.op.add(relax.op.multiply(x, y), x)),
                        [(rows, cols), (rows, cols)])


def _loops(func):
    found = []
    tvm_ffi.structural_walk(func.body, (tirx.For, found.append))
    return found


def _schedule(func, unroll, vectorize):
    """The kernel's single output block as nested loops, with the given loops unrolled / the last vectorised."""
    sch = s_tir.Schedule(func)
    for name in ("T_multiply", "T_add"):
        if _has(sch, name):
            sch.compute_inline(sch.get_sblock(name))
    out = sch.get_sblock("compute")
    loops = sch.get_loops(out)
    for i in unroll:
        sch.unroll(loops[i])
    if vectorize:
        sch.vectorize(loops[-1])
    return sch.mod["main"]


def _has(sch, name):
    try:
        sch.get_sblock(name)
        return True
    except (s_tir.ScheduleError, ValueError, tvm.error.TVMError):
        return False


def _same_numbers(a, b, shape):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(shape).astype("float32") for _ in range(2)]
    outs = []
    for f in (a, b):
        lib = tvm.compile(tvm.IRModule({"main": f}), target=HOST)
        args = [tvm.runtime.tensor(x) for x in xs] + [tvm.runtime.tensor(np.zeros(shape, "float32"))]
        lib["main"](*args)
        outs.append(args[-1].numpy())
    assert_close(outs[0], outs[1], **tol("float32"))


def test_unrolled_nest_past_the_bound_is_emitted_as_loops():
    func = _schedule(_kernel(96, 96), unroll=(0, 1), vectorize=False)
    assert unrolled_size(func.body, 4) > MAX_UNROLLED_NODES
    bounded, notes = bound_code_size(func, HOST)
    assert unrolled_size(bounded.body, 4) <= MAX_UNROLLED_NODES
    kinds = [l.kind for l in _loops(bounded)]
    assert tirx.ForKind.SERIAL in kinds and tirx.ForKind.UNROLLED in kinds   # the outer loop only
    assert notes and "unrolled" in notes[0]
    _same_numbers(_kernel(96, 96), bounded, (96, 96))   # against the unscheduled kernel (the unrolled one
    # would take LLVM minutes: what the guard is for)


def test_small_unrolled_nest_is_left_alone():
    func = _schedule(_kernel(4, 16), unroll=(0, 1), vectorize=False)
    bounded, notes = bound_code_size(func, HOST)
    assert not notes and [l.kind for l in _loops(bounded)] == [l.kind for l in _loops(func)]


def test_wide_vector_loop_is_cut_to_registers():
    func = _schedule(_kernel(8, 1024), unroll=(), vectorize=True)
    bounded, notes = bound_code_size(func, HOST)
    lanes = code_size.vector_lanes(HOST, 32)
    widths = [int(l.extent) for l in _loops(bounded) if l.kind == tirx.ForKind.VECTORIZED]
    assert widths and max(widths) <= code_size.MAX_VECTOR_REGISTERS * lanes
    assert notes and "split" in notes[0]
    _same_numbers(_kernel(8, 1024), bounded, (8, 1024))


def test_schedule_phase_bounds_every_rules_schedule():
    """The guard runs on whatever a rule returns (``apply.py``): a rule that unrolls the whole nest gets it
    emitted as loops, with the note in ``schedule_notes``."""
    from tvm_ascendfuse.report import FusionReport
    from tvm_ascendfuse.schedule.apply import ApplyUBSchedules
    from tvm_ascendfuse.schedule.base import ScheduleRule
    from tvm_ascendfuse.target import get_target

    class UnrollEverything(ScheduleRule):
        name = "unroll_everything"

        def apply(self, func, target, host):
            return s_tir.Schedule(_schedule(func, unroll=(0, 1), vectorize=False))

    report = FusionReport()
    mod = ApplyUBSchedules(get_target("ascend910b"), report, HOST, rules=[UnrollEverything])(
        tvm.IRModule({"k": _kernel(96, 96)}))
    assert report.sections["schedules"]["k"] == "unroll_everything"
    assert unrolled_size(mod["k"].body, 4) <= MAX_UNROLLED_NODES
    assert any("unrolled" in n for n in report.sections["schedule_notes"]["k"])
