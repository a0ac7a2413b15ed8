"""How far can kernel fusion take ResNet-50's (W2's) GM bytes? Bounds by fusion granularity, counted on the model.

    python benchmarks/residual_block_bound.py            # ResNet-50 at 224², as W2
    python benchmarks/residual_block_bound.py --image 112

A kernel boundary costs GM bytes: the tensor crossing it is written once and read once. Whatever a kernel
does inside, the tensors between kernels stay. So, with the compulsory lower bound LB (inputs + weights +
outputs, ``analysis.traffic.lower_bound``):

* one kernel per residual block (1x1 -> 3x3 -> 1x1 + shortcut + add + ReLU, every intermediate on chip): the
  block outputs and the stem's pooled output still cross GM (the last block's output is taken to feed the
  fused global pool and classifier);
* one kernel per stage (all blocks of a resolution, their outputs on chip too): the stage outputs still do.

Nothing is compiled or run; sizes come from ONNX shape inference (float32). Compare with what the pipeline
reaches today (``fusion_traffic.py``: one kernel per conv with its BN/ReLU/residual, pool into the next conv).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import shape_inference

from tvm_ascendfuse.analysis.traffic import lower_bound
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.target import get_target
from tvm_ascendfuse.workloads import resnet50


def _sizes(model: onnx.ModelProto) -> dict[str, int]:
    """Bytes of every value the model computes (float32)."""
    inferred = shape_inference.infer_shapes(model)
    out = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = [d.dim_value for d in v.type.tensor_type.shape.dim]
        out[v.name] = int(np.prod(dims)) * 4
    return out


def boundaries(model: onnx.ModelProto) -> tuple[list[str], str]:
    """The residual stream: the ReLU after each residual Add (block outputs, in order), and the stem's pooled
    output that the first block reads."""
    producer = {o: n for n in model.graph.node for o in n.output}
    blocks = [n.output[0] for n in model.graph.node
              if n.op_type == "Relu" and producer.get(n.input[0]) is not None
              and producer[n.input[0]].op_type == "Add"]
    pool = next(n.output[0] for n in model.graph.node if n.op_type == "MaxPool")
    return blocks, pool


def stage_ends(model: onnx.ModelProto, blocks: list[str], sizes: dict[str, int]) -> list[str]:
    """Block outputs where the next block changes resolution (or the last block): the stage outputs."""
    return [b for i, b in enumerate(blocks) if i == len(blocks) - 1 or sizes[blocks[i + 1]] != sizes[b]]


def bounds(model: onnx.ModelProto) -> dict[str, int]:
    """GM bytes: the lower bound, and the floors of one kernel per residual block and per stage."""
    sizes = _sizes(model)
    blocks, pool = boundaries(model)
    lb = lower_bound(import_onnx(model), get_target("ascend910b"))["gm_bytes"]
    stages = stage_ends(model, blocks, sizes)
    return {"lower_bound": lb, "blocks": len(blocks), "stages": len(stages),
            "per_block": lb + 2 * sum(sizes[t] for t in [pool] + blocks[:-1]),
            "per_stage": lb + 2 * sum(sizes[t] for t in [pool] + stages[:-1])}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", type=int, default=224)
    args = ap.parse_args(argv)
    b = bounds(resnet50(image=args.image))
    lb = b["lower_bound"]
    rows = [("compulsory lower bound (LB)", lb),
            (f"one kernel per residual block ({b['blocks']} blocks)", b["per_block"]),
            (f"one kernel per stage ({b['stages']} stages)", b["per_stage"])]
    print(f"ResNet-50 at {args.image}², float32; GM MB and ratio to LB")
    for label, v in rows:
        print(f"  {label:44s} {v / 1e6:8.1f} MB  {v / lb:5.2f}x")
    print(f"  (1.15x LB = {1.15 * lb / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
