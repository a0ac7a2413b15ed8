"""Per-kernel conv benchmark: every distinct conv of ResNet-50 (224²) as a one-node ONNX model, ours vs ORT.

    python benchmarks/conv_kernels.py                 # all shapes
    python benchmarks/conv_kernels.py --only s3_3x3,stem --rounds 20
    python benchmarks/conv_kernels.py --only regnetx_7x7_1x1_400,densenet_3x3_128_32_56 --flush

``OTHER_SHAPES``: dense convs of RegNet, DenseNet, Inception and MobileNet, by name with ``--only``.
``--flush`` times every call after evicting the caches (in a model each kernel's weights come from memory).

Each model is Conv (no bias) -> BatchNormalization -> epilogue, the way torchvision exports ResNet-50:
``relu`` (conv+BN+ReLU), ``add_relu`` (conv+BN + residual input, ReLU) or ``none`` (the downsample conv+BN).
Our pipeline folds BN and fuses the epilogue into one conv kernel; ORT fuses the same. Both are timed
interleaved in one process (min of many single calls), and the table gives min ms, ours/ORT, our
GFLOP/s and how many times ResNet-50 runs the shape (``count``), so ``count x ours ms`` ranks where the time goes.
CPU wall-clock on the host, not NPU times.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fusion_benchmark as fb  # noqa: E402  (sets the thread-pool environment before tvm is imported)

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_ascendfuse as af  # noqa: E402
from tvm_ascendfuse.frontend import import_onnx  # noqa: E402
from tvm_ascendfuse.workloads._graph import GraphWriter  # noqa: E402
from tvm_ascendfuse.workloads._layers import batchnorm, conv  # noqa: E402

# name: (cin, cout, hw in, kernel, stride, epilogue, times ResNet-50 runs it)
SHAPES = {
    "w1": (64, 128, 56, 3, 1, "relu", 0),         # W1's conv (not in ResNet-50)
    "stem": (3, 64, 224, 7, 2, "relu", 1),
    "s1_1x1_64_64": (64, 64, 56, 1, 1, "relu", 1),
    "s1_3x3": (64, 64, 56, 3, 1, "relu", 3),
    "s1_1x1_64_256": (64, 256, 56, 1, 1, "add_relu", 3),
    "s1_ds": (64, 256, 56, 1, 1, "none", 1),
    "s1_1x1_256_64": (256, 64, 56, 1, 1, "relu", 2),
    "s2_1x1_256_128": (256, 128, 56, 1, 1, "relu", 1),
    "s2_3x3_s2": (128, 128, 56, 3, 2, "relu", 1),
    "s2_ds_s2": (256, 512, 56, 1, 2, "none", 1),
    "s2_1x1_128_512": (128, 512, 28, 1, 1, "add_relu", 4),
    "s2_1x1_512_128": (512, 128, 28, 1, 1, "relu", 3),
    "s2_3x3": (128, 128, 28, 3, 1, "relu", 3),
    "s3_1x1_512_256": (512, 256, 28, 1, 1, "relu", 1),
    "s3_3x3_s2": (256, 256, 28, 3, 2, "relu", 1),
    "s3_ds_s2": (512, 1024, 28, 1, 2, "none", 1),
    "s3_1x1_256_1024": (256, 1024, 14, 1, 1, "add_relu", 6),
    "s3_1x1_1024_256": (1024, 256, 14, 1, 1, "relu", 5),
    "s3_3x3": (256, 256, 14, 3, 1, "relu", 5),
    "s4_1x1_1024_512": (1024, 512, 14, 1, 1, "relu", 1),
    "s4_3x3_s2": (512, 512, 14, 3, 2, "relu", 1),
    "s4_ds_s2": (1024, 2048, 14, 1, 2, "none", 1),
    "s4_1x1_512_2048": (512, 2048, 7, 1, 1, "add_relu", 3),
    "s4_1x1_2048_512": (2048, 512, 7, 1, 1, "relu", 2),
    "s4_3x3": (512, 512, 7, 3, 1, "relu", 2),
}

# dense convs of the other CNN families (count 0: not part of ResNet-50's weighted total; --only picks them)
OTHER_SHAPES = {
    "regnetx_7x7_1x1_400": (400, 400, 7, 1, 1, "relu", 0),          # RegNet-X-400MF's last stage: 25 vectors
    "regnetx_7x7_1x1_400_res": (400, 400, 7, 1, 1, "add_relu", 0),
    "regnety_7x7_1x1_784_res": (784, 784, 7, 1, 1, "add_relu", 0),   # RegNet-Y-800MF: 49 vectors
    "densenet_3x3_128_32_56": (128, 32, 56, 3, 1, "relu", 0),
    "densenet_3x3_128_32_14": (128, 32, 14, 3, 1, "relu", 0),
    "densenet_7x7_1x1_992_128": (992, 128, 7, 1, 1, "relu", 0),
    "inception_3x3_96_96_35": (96, 96, 35, 3, 1, "relu", 0),
    "mobilenet_7x7_1x1_160_960": (160, 960, 7, 1, 1, "relu", 0),
    "xception_14x14_1x1_728": (728, 728, 14, 1, 1, "relu", 0),     # Xception41 middle flow at 224²: 45.5 vectors
    "xception_19x19_1x1_728": (728, 728, 19, 1, 1, "relu", 0),     # the same at timm's default 299²
}
SHAPES.update(OTHER_SHAPES)

# depthwise convs of EfficientNet-B0/B3, MobileNet-V2/V3 and MNASNet (channels, hw in, kernel, stride, epilogue);
# cin == cout == channels, group == channels; by name with --only (not in ResNet-50's weighted total)
DW_SHAPES = {
    "dw_32_112_3": (32, 112, 3, 1, "silu"),          # EfficientNet-B0 stage 1, MobileNet-V2 (relu6)
    "dw_96_112_3_s2": (96, 112, 3, 2, "silu"),
    "dw_144_56_3": (144, 56, 3, 1, "silu"),
    "dw_144_56_5_s2": (144, 56, 5, 2, "silu"),
    "dw_240_28_5": (240, 28, 5, 1, "silu"),
    "dw_240_28_3_s2": (240, 28, 3, 2, "silu"),
    "dw_480_14_3": (480, 14, 3, 1, "silu"),
    "dw_144_56_3_relu6": (144, 56, 3, 1, "relu6"),   # MobileNet-V2
    "dw_48_112_3_relu": (48, 112, 3, 1, "relu"),     # MNASNet
    "dw_72_56_5_s2_hswish": (72, 56, 5, 2, "hardswish"),  # MobileNet-V3-Large (relu there; hard-swish later)
    "dw_72_56_3_relu": (72, 56, 3, 1, "relu"),       # MNASNet: 72 and 120 channels, 8 a vector on AVX-512
    "dw_80_56_3_relu": (80, 56, 3, 1, "relu"),       # (not in a model: 72's neighbour that 16 divides)
    "dw_120_28_5_relu": (120, 28, 5, 1, "relu"),
    "dw_48_112_3_s2_relu": (48, 112, 3, 2, "relu"),  # MNASNet's first stride-2 depthwise (112 -> 56)
    "dw_72_56_5_s2_relu": (72, 56, 5, 2, "relu"),    # MNASNet 56 -> 28
    "dw_480_14_5_relu": (480, 14, 5, 1, "relu"),     # MNASNet
    "dw_1152_7_5_relu": (1152, 7, 5, 1, "relu"),     # MNASNet's last stage: 49 pixels a channel
    "dw_58_28_3": (58, 28, 3, 1, "none"),            # ShuffleNetV2 x1.0: 58, 116, 232 channels (BN, no act)
    "dw_116_28_3_s2": (116, 28, 3, 2, "none"),
    "dw_116_14_3": (116, 14, 3, 1, "none"),
    "dw_232_7_3": (232, 7, 3, 1, "none"),
    "dw_200_14_3_hswish": (200, 14, 3, 1, "hardswish"),  # MobileNetV3-Large: 200 and 184 channels
}
SHAPES.update({n: (c, c, hw, k, s, e, 0) for n, (c, hw, k, s, e) in DW_SHAPES.items()})


def out_hw(hw, k, stride):
    return (hw + 2 * (k // 2) - k) // stride + 1


def depthwise(g: GraphWriter, x: str, c: int, k: int, stride: int) -> str:
    w = g.normal((c, 1, k, k), (2.0 / (k * k)) ** 0.5, "dw_w")
    return g.op("Conv", [x, w], "dw", kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
                dilations=[1, 1], group=c)


def conv_model(cin, cout, hw, k, stride, epilogue, seed=0, groups=1) -> onnx.ModelProto:
    g = GraphWriter("conv_kernel", seed)
    x = g.input("x", [1, cin, hw, hw])
    oh = out_hw(hw, k, stride)
    if epilogue == "add_relu":
        g.input("r", [1, cout, oh, oh])
    c = depthwise(g, x, cin, k, stride) if groups > 1 else conv(g, x, cin, cout, k, stride=stride)
    y = batchnorm(g, c, cout)
    if epilogue == "relu":
        g.op("Relu", [y], out="y")
    elif epilogue == "relu6":
        g.op("Clip", [y, g.const(np.float32(0.0), "lo"), g.const(np.float32(6.0), "hi")], out="y")
    elif epilogue == "silu":
        g.op("Mul", [y, g.op("Sigmoid", [y], "sig")], out="y")
    elif epilogue == "hardswish":
        g.op("HardSwish", [y], out="y")
    elif epilogue == "add_relu":
        g.op("Relu", [g.op("Add", [y, "r"], "residual")], out="y")
    else:
        g.op("Identity", [y], out="y")
    return g.finish({"y": [1, cout, oh, oh]})


class Ort:
    def __init__(self, model, feeds):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = fb.ORT_THREADS
        self.sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.io = self.sess.io_binding()
        for name, v in feeds.items():
            self.io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(v))
        self.io.bind_output("y")

    def __call__(self):
        self.sess.run_with_iobinding(self.io)

    def output(self):
        return self.io.copy_outputs_to_cpu()[0]


class Ours:
    def __init__(self, executable, feeds):
        self.fn = relax.VirtualMachine(executable, tvm.cpu())["main"]
        self.args = [tvm.runtime.tensor(v) for v in feeds.values()]
        self.last = None

    def __call__(self):
        self.last = self.fn(*self.args)

    def output(self):
        return self.last.numpy()


# bytes written between calls with --flush: more than this host's last-level cache (32 MB on the Zen 5
# measured), so weights, input and output come from memory as in a whole model (ResNet-50: 102 MB of weights)
FLUSH_BYTES = 64 << 20
_FLUSH = None


def single_call_min(runners, rounds, flush=False) -> dict:
    """Min over many single timed calls, runners interleaved (after one warm call each): on a shared machine
    short samples find the undisturbed windows (two identical kernels agree within ~1%, 1 thread).
    ``flush``: every timed call follows a write of FLUSH_BYTES instead (cold caches, the in-model condition:
    each kernel of a model reads weights the previous kernels evicted)."""
    global _FLUSH
    if flush and _FLUSH is None:
        _FLUSH = np.zeros(FLUSH_BYTES // 4, dtype="float32")
    best = dict.fromkeys(runners, float("inf"))
    for _ in range(rounds):
        for name, f in runners.items():
            time.sleep(fb.SWITCH_PAUSE_S)    # ORT's idle workers spin after a run and steal a core from TVM's
            if flush:
                _FLUSH += 1.0
            else:
                f()
            t = time.perf_counter()
            f()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def bench_shape(name, rounds=60, target="ascend910b", log=print, flush=False) -> dict:
    cin, cout, hw, k, stride, epi, count = SHAPES[name]
    groups = cin if name in DW_SHAPES else 1
    model = conv_model(cin, cout, hw, k, stride, epi, groups=groups)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, cin, hw, hw)).astype("float32")}
    oh = out_hw(hw, k, stride)
    if epi == "add_relu":
        feeds["r"] = rng.standard_normal((1, cout, oh, oh)).astype("float32")
    t0 = time.perf_counter()
    res = af.compile_model(import_onnx(model), target=target, portable=False)
    compile_s = time.perf_counter() - t0
    runners = {"ort": Ort(model, feeds), "ours": Ours(res.executable, feeds)}
    best = single_call_min(runners, rounds, flush)
    ref = runners["ort"].output()              # error relative to the output's own scale
    err = float(np.max(np.abs(runners["ours"].output() - ref)) / max(1e-30, float(np.max(np.abs(ref)))))
    ours, ort = best["ours"] * 1e3, best["ort"] * 1e3
    flops = 2 * cout * oh * oh * (cin // groups) * k * k
    row = {"shape": name, "count": count, "ort_ms": ort, "ours_ms": ours, "ratio": ours / ort,
           "gflops": flops / ours / 1e6, "ort_gflops": flops / ort / 1e6, "rel_err": err,
           "compile_s": compile_s, "weighted_excess_ms": count * (ours - ort)}
    log(f"{name:18s} x{count}  ort {ort:7.3f}  ours {ours:7.3f}  ratio {ours / ort:5.2f}  "
        f"{row['gflops']:6.1f} GF/s (ort {row['ort_gflops']:6.1f})  excess x count {row['weighted_excess_ms']:6.3f} ms"
        f"  rel err {err:.1e}")
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default="", help="comma list of shape names (default all)")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--target", default="ascend910b")
    p.add_argument("--ort-threads", type=int, default=fb.ORT_THREADS,
                   help="ORT intra-op threads; match TVM_NUM_THREADS (1 and 1 are steadier on a busy machine)")
    p.add_argument("--flush", action="store_true",
                   help="time each call after evicting the caches (the in-model condition) instead of warm")
    args = p.parse_args(argv)
    fb.ORT_THREADS = args.ort_threads
    names = [s for s in args.only.split(",") if s] or [s for s in SHAPES if SHAPES[s][-1]]
    rows = [bench_shape(n, args.rounds, args.target, flush=args.flush) for n in names]
    tot_ort = sum(r["count"] * r["ort_ms"] for r in rows)
    tot_ours = sum(r["count"] * r["ours_ms"] for r in rows)
    if tot_ort:
        print(f"weighted total (x count): ort {tot_ort:.2f} ms, ours {tot_ours:.2f} ms, ratio {tot_ours / tot_ort:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
