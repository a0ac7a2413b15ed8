"""``ascendfuse tune``: MetaSchedule search over the tunable rules for every distinct kernel of a model.

The model goes through the pipeline up to the schedule phase (``kernels.py``), so each kernel is keyed
exactly as the schedule phase will look it up. Every kernel the schedule phase would give to a tunable rule
(one that declares ``tunable``: today Matmul and Conv2d) is searched in that rule's space
(``schedule/tunable.py``), largest share of the model's run time first (``run.py``), within an optional
time budget (``budget.py``), measured on this machine or through TVM's RPC tracker (``measure.py``,
``rpc.py``); a kernel's record replaces the rule's default only when it beats it side by side
(``search.py``). Records go to ``DIR/<target>/<cpu>/`` as a JSON database that ``compile`` reads with
``ASCENDFUSE_SCHEDULES=DIR``; ``DIR/<target>/<cpu>/work/`` holds what a rerun resumes from (``workdir.py``).
"""

from .budget import Budget, parse_duration
from .kernels import Kernel, extract_kernels, select_kernels
from .measure import Measure, RPCSpec, build_candidate, parse_address
from .run import KernelResult, TuneSummary, TuningRun, check_trials, check_tuning_installed, tune_model
from .search import MIN_GAIN, confirm_kernel, search_kernel, tile_decision, worth_recording

__all__ = [
    "Budget", "Kernel", "KernelResult", "MIN_GAIN", "Measure", "RPCSpec", "TuneSummary", "TuningRun",
    "build_candidate", "check_trials", "check_tuning_installed", "confirm_kernel", "extract_kernels",
    "parse_address", "parse_duration", "search_kernel", "select_kernels", "tile_decision", "tune_model",
    "worth_recording",
]
