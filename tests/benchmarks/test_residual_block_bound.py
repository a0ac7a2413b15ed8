"""benchmarks/residual_block_bound.py: block outputs and stage ends found on a small ResNet-50, bounds ordered."""

import importlib.util
from pathlib import Path

from tvm_ascendfuse.workloads import resnet50

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "residual_block_bound.py"
_spec = importlib.util.spec_from_file_location("residual_block_bound", _PATH)
bound = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bound)


def test_blocks_and_stages_of_a_small_resnet():
    model = resnet50(image=32, base_width=8)
    sizes = bound._sizes(model)
    blocks, pool = bound.boundaries(model)
    assert len(blocks) == 3 + 4 + 6 + 3
    stages = bound.stage_ends(model, blocks, sizes)
    assert stages == [blocks[2], blocks[6], blocks[12], blocks[15]]
    assert sizes[pool] == 8 * 8 * 8 * 4                       # 32² -> stem /2 -> pool /2, 8 channels


def test_bounds_are_ordered():
    b = bound.bounds(resnet50(image=32, base_width=8))
    assert b["lower_bound"] < b["per_stage"] < b["per_block"]
    assert (b["blocks"], b["stages"]) == (16, 4)
