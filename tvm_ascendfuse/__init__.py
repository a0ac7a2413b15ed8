"""tvm_ascendfuse: CANN-style operator fusion for TVM Relax, targeting an Ascend-like NPU.

Architecture: target -> patterns -> passes (graph fusion, grouping) -> cost model -> schedules
-> pipeline -> cli/report.
"""

from .host_threads import use_physical_cores

use_physical_cores()      # before anything starts TVM's thread pool (host_threads.py says why)

from .errors import (AscendFuseError, ModelError, SwitchError, TargetError, UBCapacityError,  # noqa: E402
                     UnsupportedOpError)
from .target import PRESETS, AscendTarget, get_target, load_target_file, make_target
from .switches import FusionSwitches, known_switches
from .report import FusionReport
from . import graph_fusion, patterns, grouping  # noqa: F401  (importing registers the pattern table)
from .pipeline import AscendFusePipeline, ascendfuse_pipeline
from .api import compile_model


def from_torch(module, example_args, dynamic_shapes=None, example_kwargs=None):
    """PyTorch module -> Relax IRModule for ``compile_model`` (``torch_frontend.from_torch``; needs torch)."""
    from .torch_frontend import from_torch as _from_torch

    return _from_torch(module, example_args, dynamic_shapes=dynamic_shapes, example_kwargs=example_kwargs)


__all__ = [
    "AscendFuseError", "ModelError", "SwitchError", "TargetError", "UBCapacityError", "UnsupportedOpError",
    "PRESETS", "AscendTarget", "get_target", "load_target_file", "make_target",
    "FusionSwitches", "known_switches", "FusionReport",
    "AscendFusePipeline", "ascendfuse_pipeline", "compile_model", "from_torch",
]
