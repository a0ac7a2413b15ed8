"""A whole-model tuning run: every distinct tunable kernel, the ones that take the model's time first.

``TuningRun`` owns a run's state (the kernels in order, the budget, the measurer, the databases, the work
dir, the progress bar): it times every distinct kernel's untuned schedule once (cached in the work dir) to
get each kernel's share of the model's run time (time of one launch x launches), then searches the tunable
kernels in order of that share, each followed by its side-by-side check against the rule's default.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tvm

from ..errors import AscendFuseError
from ..progress import ProgressBar
from ..target import AscendTarget, get_target
from .budget import Budget, format_duration, parse_duration
from .kernels import Kernel, extract_kernels, select_kernels
from .measure import Measure, RPCSpec, args_of, count_servers, last_line
from .search import best_us, confirm_kernel, default_and_best, kernel_records, search_kernel
from .workdir import WorkDir, write_json

SUMMARY_FILE = "summary.json"


@dataclass
class KernelResult:
    name: str
    rule: str
    status: str                        # tuned | already tuned | not reached | failed
    share: float | None = None         # of the model's untuned run time (measured once)
    calls: int = 1
    trials: int = 0                    # candidates measured (earlier runs of the work dir included)
    trials_now: int = 0                # of those, measured by this run
    lost: int = 0                      # of those, without a time (build/run error, RPC server lost)
    default_us: float | None = None    # the rule's default, timed beside the best candidates
    best_us: float | None = None       # the best record (the default unless a candidate beat it)
    best_tiles: str = ""
    note: str = ""


@dataclass
class TuneSummary:
    database: Path
    cpu: str
    kernels: list[Kernel]
    results: list[KernelResult] = field(default_factory=list)
    seconds: float = 0.0
    budget: float | None = None
    rpc: str | None = None
    work_dir: Path | None = None

    def table(self) -> str:
        fmt = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
        w = min(64, max([6] + [len(r.name) for r in self.results]))
        rows = [f"{'kernel':{w}s} {'rule':8s} {'share':>6s} {'trials':>6s} {'lost':>4s} {'default us':>11s} "
                f"{'tuned us':>9s}  best tiles / status"]
        for r in self.results:
            share = f"{100 * r.share:5.1f}%" if r.share is not None else "     -"
            what = r.best_tiles if r.status == "tuned" else r.status
            if r.note:
                what = f"{what} ({r.note})" if what else r.note
            rows.append(f"{r.name[:w]:{w}s} {r.rule:8s} {share:>6s} {r.trials:6d} {r.lost:4d} "
                        f"{fmt(r.default_us):>11s} {fmt(r.best_us):>9s}  {what}")
        now, total = sum(r.trials_now for r in self.results), sum(r.trials for r in self.results)
        where = f"through the RPC tracker ({self.rpc})" if self.rpc else "on this machine"
        budget = f" of a {format_duration(self.budget)} budget" if self.budget else ""
        earlier = f" ({total} with earlier runs)" if total != now else ""
        rows.append(f"\n{now} candidates measured {where}{earlier}; {format_duration(self.seconds)} wall time"
                    f"{budget}; records for CPU '{self.cpu}'")
        return "\n".join(rows)

    def to_dict(self) -> dict:
        return {"database": str(self.database), "cpu": self.cpu, "seconds": round(self.seconds, 1),
                "budget_seconds": self.budget, "rpc": self.rpc, "results": [asdict(r) for r in self.results]}


class TuningRun:
    """One run over the selected kernels of a model (see the module docstring)."""

    def __init__(self, npu: AscendTarget, host, kernels: list[Kernel], everything: list[Kernel], database,
                 work: WorkDir, measure: Measure, trials: int | None, budget: Budget, seed: int = 0,
                 batch: int = 8, finalists: int = 3, rounds: int = 3, bar: ProgressBar | None = None, log=None):
        self.npu, self.host = npu, host
        self.kernels, self.everything = kernels, everything
        self.database, self.work, self.measure = database, work, measure
        self.trials, self.budget, self.seed = trials, budget, seed
        self.batch, self.finalists, self.rounds = batch, finalists, rounds
        self.bar = bar
        self._log = log
        self.shares: dict[str, float | None] = {}
        # the least a kernel took for one batch and its side-by-side check: with less budget left, starting
        # another kernel would only overrun it
        self.least_kernel_seconds = 0.0

    def say(self, text: str) -> None:
        if self._log is not None:
            self._log(text)
        elif self.bar is not None:
            self.bar.say(text)

    # ------------------------------------------------------------------------------------------------
    def profile(self) -> dict[str, float | None]:
        """Each kernel's share of the model's untuned run time: its default schedule timed once per distinct
        kernel (cached in the work dir by workload), times its launches."""
        cached = self.work.profile()
        todo = [k for k in self.everything if k.key not in cached and k.static and k.default is not None]
        if todo:
            self.say(f"timing the {len(todo)} distinct kernels untuned, once, for their share of the run time")
            mods, ok = [], []
            for k in todo:
                try:
                    mods.append((k.default, args_of(k.default)))
                    ok.append(k)
                except Exception as err:  # noqa: BLE001 - a kernel we cannot time only loses its share
                    cached[k.key] = {"name": k.name, "us": None, "error": str(err).strip()[-200:]}
            for k, (secs, err) in zip(ok, self.measure(mods)):
                cached[k.key] = {"name": k.name, "us": None if secs is None else secs * 1e6,
                                 **({"error": str(err).strip().splitlines()[-1][:200]} if err else {})}
            self.work.save_profile(cached)
        us = {k.key: (cached.get(k.key) or {}).get("us") for k in self.everything}
        total = sum(us[k.key] * k.calls for k in self.everything if us[k.key])
        self.shares = {k.key: (us[k.key] * k.calls / total if us[k.key] and total else None)
                       for k in self.everything}
        return self.shares

    def order(self) -> list[Kernel]:
        """Largest share first; kernels that could not be timed last, by name."""
        return sorted(self.kernels, key=lambda k: (self.shares.get(k.key) is None, -(self.shares.get(k.key) or 0),
                                                   k.name))

    def run(self) -> list[KernelResult]:
        if not self.shares:
            self.profile()
        order = self.order()
        done = {k.key for k in order if kernel_records(self.database, k)}
        pending = [k for k in order if k.key not in done]
        if self.bar is not None and self.trials is not None:
            self.bar.set_total(self.trials * len(pending))
        results = []
        for kernel in order:
            result = KernelResult(kernel.name, kernel.rule or "", "", self.shares.get(kernel.key), kernel.calls)
            state = self.work.state(kernel)
            result.trials, result.lost = state["measured"], state["failed"]
            if kernel.key in done:
                result.status = "already tuned"
            elif self.budget.expired() or (self.budget.deadline is not None
                                           and self.budget.remaining() < self.least_kernel_seconds):
                result.status = "not reached"
                result.note = "budget spent; a rerun resumes it"
            else:
                to_come = [self.shares.get(k.key) for k in pending[pending.index(kernel):]]
                self._tune(kernel, result, state, self.budget.kernel_deadline(result.share, to_come),
                           f"kernels done {len(results)}/{len(order)}")
            result.default_us, result.best_us, result.best_tiles = default_and_best(self.database, kernel)
            results.append(result)
        return results

    def _tune(self, kernel: Kernel, result: KernelResult, state: dict, deadline: float | None, done: str):
        share = f", {100 * result.share:.1f}% of the run time" if result.share is not None else ""
        self.say(f"tuning {kernel.name} ({kernel.rule}{share})")
        searched = self.work.search_database(kernel)
        if self.bar is not None:
            self.bar.update(min(state["measured"], self.trials or state["measured"]))

        untuned = (self.work.profile().get(kernel.key) or {}).get("us")
        clock = self.budget.clock
        started, first_batch = clock(), []

        def on_batch(st, n, best):
            if not first_batch:
                first_batch.append(clock() - started)
            self.work.save_state(kernel, st)
            if self.bar is not None:
                self.bar.update(n)
                times = f"best {best:.1f} us" if best is not None else "nothing measured yet"
                if untuned is not None:
                    times += f" (untuned {untuned:.1f} us)"
                self.bar.status(f"{done}, {kernel.name[:32]}: {times}")

        try:
            outcome = search_kernel(kernel, self.npu, self.host, self.trials, searched, self.measure,
                                    self.seed + 1 + self.kernels.index(kernel), state, deadline, self.batch,
                                    on_batch, self.budget.clock)
        except Exception as err:  # noqa: BLE001 - a rule whose space cannot be built loses this kernel only
            result.status = "failed"
            result.note = f"its tile space could not be built ({last_line(err)}); the rule's default stays"
            return
        result.trials_now = outcome.measured - result.trials
        result.trials, result.lost = outcome.measured, outcome.failed
        if outcome.stopped:
            result.note = f"the budget cut its search at {outcome.measured} candidates"
        if best_us(searched, kernel) is None:
            result.status = "failed"
            result.note = f"none of {outcome.measured} candidates could be measured ({outcome.first_error})"
            return
        checked = clock()
        why = confirm_kernel(kernel, self.npu, self.host, searched, self.database, self.measure, self.finalists,
                             self.rounds)
        if first_batch:
            least = first_batch[0] + clock() - checked
            self.least_kernel_seconds = min(self.least_kernel_seconds, least) if self.least_kernel_seconds else least
        if why is not None:
            result.status, result.note = "failed", why
            return
        result.status = "tuned"


def tune_model(model, target: str | AscendTarget = "ascend910b", trials: int | None = 32,
               output: str | os.PathLike = "schedules", kernels: list[str] | None = None, switches=None,
               portable: bool = False, seed: int = 0, budget: float | str | None = None,
               rpc: RPCSpec | None = None, work_dir: str | os.PathLike | None = None, quiet: bool = False,
               log=None, batch: int = 8, finalists: int = 3, rounds: int = 3) -> TuneSummary:
    """Tune ``model`` (ONNX path/ModelProto or a Relax IRModule); records go to ``output/<target>/<cpu>/``.

    ``trials``: candidates per kernel (None: each candidate of its space once); ``budget``: seconds or a
    duration (``"30m"``) for the whole run; ``rpc``: measure through a tracker's servers; ``work_dir``
    (default ``output/<target>/<cpu>/work``): what a rerun resumes from. Progress goes to a bar on stderr
    (when it is a terminal and not ``quiet``) and messages to ``log`` if given."""
    from ..frontend import import_onnx
    from ..schedule.tuned import host_cpu, open_database

    if trials is None and budget is None:
        raise AscendFuseError("give --trials N (candidates per kernel), --budget DURATION, or both")
    if trials is not None:
        check_trials(trials)
    seconds = parse_duration(budget) if isinstance(budget, str) else budget
    clock = Budget(seconds)             # the budget counts from here: kernel extraction and timing included
    check_tuning_installed(rpc is not None)
    if rpc is not None:
        count_servers(rpc)              # before anything is written: a tracker that is not there is an error
    npu = get_target(target)
    host = npu.host_target(portable=portable)
    cpu = host_cpu(host)
    mod = model if isinstance(model, tvm.IRModule) else import_onnx(model)
    found = extract_kernels(mod, npu, host, switches)
    chosen = select_kernels(found, kernels)
    folder = Path(output) / npu.name / cpu
    folder.mkdir(parents=True, exist_ok=True)
    database = open_database(folder, allow_missing=True)
    work = WorkDir(work_dir if work_dir is not None else folder / "work")
    summary = TuneSummary(folder, cpu, found, budget=seconds, rpc=str(rpc) if rpc else None, work_dir=work.path)
    measure = None
    with ProgressBar(None, f"tuning {len(chosen)} kernel(s)", unit="trial", quiet=quiet) as bar:
        try:
            measure = Measure(host, rpc)
            run = TuningRun(npu, host, chosen, found, database, work, measure, trials, clock, seed,
                            max(batch, 2 * measure.workers), finalists, rounds, bar, log)
            summary.results = run.run()
        finally:
            if measure is not None:
                measure.close()
    summary.seconds = clock.elapsed()
    write_json(work.path / SUMMARY_FILE, summary.to_dict())
    failed = [r for r in summary.results if r.status == "failed"]
    if failed and len(failed) == len(summary.results):
        raise AscendFuseError(f"kernel '{failed[0].name}': {failed[0].note}")
    return summary


TUNE_MODULES = ("cloudpickle", "psutil")   # MetaSchedule's builder/runner worker processes need them
RPC_MODULES = ("tornado",)                 # TVM's RPC tracker and servers


def check_tuning_installed(rpc: bool = False) -> None:
    import importlib.util

    missing = [m for m in TUNE_MODULES + (RPC_MODULES if rpc else ()) if importlib.util.find_spec(m) is None]
    if missing:
        raise AscendFuseError(f"tuning needs the Python package(s) {', '.join(missing)}; install them with: "
                              "pip install 'tvm_ascendfuse[tune]'")


def check_trials(trials) -> None:
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise AscendFuseError(f"--trials must be a positive number of measured candidates per kernel, got {trials!r}")
