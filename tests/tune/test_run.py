"""A whole-model run (``TuningRun``): kernels in order of their share of the run time (launches counted), the
budget spent by share and stopping cleanly, a rerun skipping tuned kernels and resuming a cut-off search,
lost candidates counted, and per kernel only the default and what beats it side by side recorded.

The measurer here is a stand-in that times nothing (real builds and runs are covered by the CLI and RPC
tests): the run's logic is checked with chosen times and a clock that advances a second per candidate."""

import pytest
import tvm_ffi

from tests.tune.models import NO_CHAIN, mlp
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.schedule.tuned import open_database
from tvm_ascendfuse.target import get_target
from tvm_ascendfuse.tune import MIN_GAIN, Budget, TuningRun, extract_kernels, select_kernels, tile_decision
from tvm_ascendfuse.tune.search import kernel_records, record_us
from tvm_ascendfuse.tune.workdir import WorkDir

NPU = get_target("ascend910b")
HOST = NPU.host_target(portable=True)
CONFIRM_MS = [0.99, 0.5, 1.5]       # non-default picks beside a 1.0 ms default: within the margin, winner, slower


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class FakeMeasure:
    """Times without building. The untuned kernels (the profile) get ``untuned_us``; searched candidates a
    time from their structure; the side-by-side check 1.0 ms for the default (always first) and CONFIRM_MS
    in turn for the others. Every candidate measured costs ``cost`` seconds of ``clock``; ``fail(i)`` makes
    the i-th searched candidate a lost one."""

    workers = cores = 1

    def __init__(self, clock, kernels, untuned_us, cost=1.0, fail=lambda i: False):
        self.clock, self.kernels, self.untuned_us, self.cost, self.fail = clock, kernels, untuned_us, cost, fail
        self.searched = 0
        self.profiled = []
        self.confirmed = []

    def __call__(self, mods_args, rounds=1, serial=False):
        out = []
        defaults = [next((k for k in self.kernels if tvm_ffi.structural_equal(mod, k.default)), None)
                    for mod, _ in mods_args]
        # the untuned kernels, timed before anything else (a search batch has more than the default)
        profile = not serial and all(defaults)
        for i, (mod, _) in enumerate(mods_args):
            self.clock.t += self.cost * rounds
            if serial:
                ms = 1.0 if i == 0 else CONFIRM_MS[(i - 1) % len(CONFIRM_MS)]
                self.confirmed.append(ms)
                out.append((ms * 1e-3, None))
            elif profile:
                untuned = defaults[i]
                self.profiled.append(untuned.key)
                out.append((self.untuned_us[untuned.key] * 1e-6, None))
            else:
                self.searched += 1
                if self.fail(self.searched):
                    out.append((None, "RPCRunner: An exception occurred\nConnectionResetError: lost the server"))
                else:
                    out.append((1e-3 * (0.6 + (tvm_ffi.structural_hash(mod) % 80) / 100), None))
        return out

    def close(self):
        pass


def make_run(tmp_path, widths, untuned_us_by_index, trials=4, budget=None, batch=2, fail=lambda i: False,
             finalists=3):
    found = extract_kernels(import_onnx(mlp(widths)), NPU, HOST, NO_CHAIN)
    untuned = {k.key: us for k, us in zip(found, untuned_us_by_index)}
    clock = Clock()
    measure = FakeMeasure(clock, found, untuned, fail=fail)
    (tmp_path / "db").mkdir(parents=True, exist_ok=True)
    database = open_database(tmp_path / "db", allow_missing=True)
    run = TuningRun(NPU, HOST, select_kernels(found, None), found, database, WorkDir(tmp_path / "work"), measure,
                    trials, Budget(budget, clock=clock), batch=batch, finalists=finalists, rounds=1)
    return run, found, measure, clock


def test_kernels_in_order_of_share_with_launches_counted(tmp_path):
    # 32->32 twice (one kernel, two launches) then 32->64: 2 x 10 us beats 1 x 15 us
    run, found, measure, _ = make_run(tmp_path, [32, 32, 32, 64], [10.0, 15.0])
    assert [k.calls for k in found] == [2, 1]
    shares = run.profile()
    assert shares[found[0].key] == pytest.approx(20 / 35) and shares[found[1].key] == pytest.approx(15 / 35)
    assert [k.key for k in run.order()] == [found[0].key, found[1].key]
    # the untuned times are kept in the work dir: a second run does not time them again
    again, _, measure2, _ = make_run(tmp_path, [32, 32, 32, 64], [99.0, 1.0])
    assert again.profile() == shares and measure2.profiled == []


def test_a_whole_run_records_per_kernel_only_what_beats_the_default_and_a_rerun_skips_it(tmp_path):
    run, found, measure, _ = make_run(tmp_path, [32, 48, 24], [5.0, 30.0])
    results = run.run()
    assert [r.name for r in results] == [found[1].name, found[0].name]          # larger share first
    assert [r.status for r in results] == ["tuned", "tuned"]
    assert all(r.trials == r.trials_now == 4 and r.lost == 0 for r in results)
    assert len(measure.confirmed) == 8                                          # default + 3 picks, per kernel
    for kernel in found:
        timed = {tile_decision(r): record_us(r) for r in kernel_records(run.database, kernel)}
        assert timed[0] == pytest.approx(1000.0)                                # the default, timed beside them
        others = [t for d, t in timed.items() if d != 0]
        assert others == [pytest.approx(500.0)]                                 # 0.99 and 1.5 ms were not kept
        assert all(t < timed[0] * (1 - MIN_GAIN) for t in others)
    assert [r.best_us for r in results] == [pytest.approx(500.0)] * 2

    rerun, _, measure2, _ = make_run(tmp_path, [32, 48, 24], [5.0, 30.0])
    again = rerun.run()
    assert [r.status for r in again] == ["already tuned"] * 2 and measure2.searched == 0
    assert [r.trials for r in again] == [4, 4] and [r.trials_now for r in again] == [0, 0]


def test_the_budget_goes_by_share_and_a_kernel_it_cannot_reach_is_left_for_a_rerun(tmp_path):
    # each candidate costs one second (batches of 2, a check of 2); timing the untuned kernels takes 2 s,
    # so 18 s are left: the first kernel (3/4 of the run time) may search until 2 + 13.5 s, the second gets
    # what is left after the first's check
    run, found, measure, clock = make_run(tmp_path / "a", [32, 48, 24], [10.0, 30.0], trials=None, budget=20.0,
                                          finalists=1)
    first, second = run.run()
    assert first.name == found[1].name and first.share == pytest.approx(0.75)
    assert (first.trials, second.trials) == (10, 4)
    assert "budget cut its search" in first.note and "budget cut its search" in second.note
    assert all(r.status == "tuned" for r in (first, second))
    assert clock.t == pytest.approx(20.0)

    # 3 s to tune: the first kernel takes 4 s (a batch and its check), the second is not started
    run, found, measure, clock = make_run(tmp_path / "b", [32, 48, 24], [10.0, 30.0], trials=None, budget=5.0,
                                          finalists=1)
    first, second = run.run()
    assert first.status == "tuned" and second.status == "not reached" and second.trials == 0
    assert "a rerun resumes it" in second.note and clock.t == pytest.approx(6.0)

    # 2 s of 8 left after the first kernel, which took 4: the second is not started to overrun the budget
    run, found, measure, clock = make_run(tmp_path / "c", [32, 48, 24], [10.0, 30.0], trials=None, budget=8.0,
                                          finalists=1)
    first, second = run.run()
    assert clock.t == pytest.approx(6.0) and run.least_kernel_seconds == pytest.approx(4.0)
    assert first.status == "tuned" and second.status == "not reached"


def test_without_trials_a_long_budget_measures_each_candidate_once(tmp_path):
    from tvm_ascendfuse.schedule.tunable import candidate_schedules

    run, found, measure, _ = make_run(tmp_path, [32, 48, 24], [10.0, 30.0], trials=None, budget=1e6, batch=8)
    results = run.run()
    for kernel, result in zip(sorted(found, key=lambda k: k.name), sorted(results, key=lambda r: r.name)):
        size = len(candidate_schedules(kernel.workload, "matmul", NPU, HOST))
        searched = kernel_records(run.work.search_database(kernel), kernel)
        assert result.trials == size and len({tile_decision(r) for r in searched}) == size


def test_an_interrupted_search_resumes_where_it_stopped(tmp_path, monkeypatch):
    """Stopped after its first batch (as by a kill: the state of every finished batch is on disk), the next
    run measures only the rest, and no tile twice."""
    real_save = WorkDir.save_state

    def save_then_stop(self, kernel, state):
        real_save(self, kernel, state)
        raise KeyboardInterrupt

    monkeypatch.setattr(WorkDir, "save_state", save_then_stop)
    run, found, _, _ = make_run(tmp_path, [32, 48, 24], [5.0, 30.0], trials=6)
    with pytest.raises(KeyboardInterrupt):
        run.run()
    monkeypatch.setattr(WorkDir, "save_state", real_save)
    first = found[1]
    assert run.work.state(first) == {"measured": 2, "failed": 0}
    assert not kernel_records(run.database, first)                            # not tuned yet: no records

    rerun, _, _, _ = make_run(tmp_path, [32, 48, 24], [5.0, 30.0], trials=6)
    results = rerun.run()
    assert results[0].name == first.name and results[0].trials == 6 and results[0].trials_now == 4
    searched = kernel_records(rerun.work.search_database(first), first)
    assert len(searched) == 6 and len({tile_decision(r) for r in searched}) == 6


def test_lost_candidates_are_counted_and_the_run_goes_on(tmp_path):
    run, found, measure, _ = make_run(tmp_path, [32, 48, 24], [5.0, 30.0], trials=6, fail=lambda i: i % 3 == 0)
    results = run.run()
    assert [r.status for r in results] == ["tuned", "tuned"]
    assert [(r.trials, r.lost) for r in results] == [(6, 2), (6, 2)]
    for kernel in found:
        assert len(kernel_records(run.work.search_database(kernel), kernel)) == 4


def test_a_kernel_no_candidate_of_which_runs_fails_alone(tmp_path):
    run, found, measure, _ = make_run(tmp_path, [32, 48, 24], [5.0, 30.0], trials=3, fail=lambda i: i <= 3)
    first, second = run.run()
    assert first.status == "failed" and "none of 3 candidates could be measured" in first.note
    assert "lost the server" in first.note and not kernel_records(run.database, found[1])
    assert second.status == "tuned"


def test_a_kernel_whose_space_cannot_be_built_fails_alone(tmp_path, monkeypatch):
    """A rule that raises while its tile space is built (a schedule primitive refusing a candidate's layout)
    costs that kernel only: reported failed with the error, the run goes on to the next kernel."""
    import tvm_ascendfuse.tune.run as run_module

    run, found, measure, _ = make_run(tmp_path, [32, 48, 24], [5.0, 30.0], trials=3)
    real = run_module.search_kernel
    calls = []

    def search(kernel, *args, **kwargs):
        calls.append(kernel)
        if len(calls) == 1:                              # the first kernel the run tunes
            raise RuntimeError("InternalError: Check failed: tensorize\n  the last line")
        return real(kernel, *args, **kwargs)

    monkeypatch.setattr(run_module, "search_kernel", search)
    first, second = run.run()
    assert first.status == "failed" and "tile space could not be built (the last line)" in first.note
    assert second.status == "tuned"
