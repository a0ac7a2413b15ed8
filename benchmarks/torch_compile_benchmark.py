"""Steady-state time of a public model through ``torch.compile(backend="ascendfuse")`` against the same model
through our ONNX path (``import_onnx`` + ``compile_model`` + the VM), each in its own process.

Both workers build first (dynamo's trace and our build; the ONNX export, import and build), then the parent
asks them for timed rounds in turns (compile, onnx, compile, onnx...), so they never run at the same time and
load changes hit both. A round is a warm call and then calls for ``--round-s`` seconds, and gives each
worker's best call; the figure is the median over rounds of the two workers' ratio (and the ratio of their
best rounds). The torch.compile call includes what a PyTorch user pays per call: dynamo's guards, the DLPack
hand-over of inputs and outputs and the torch tensors made from the VM's outputs.

    python benchmarks/torch_compile_benchmark.py resnet50 --rounds 30 --round-s 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
TARGET = "ascend910b"


def _round(fn, round_s: float) -> float:
    fn()
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < round_s:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _setup_compile(name: str):
    import torch

    import public_models
    import tvm_ascendfuse.torch_compile  # noqa: F401  (registers the backend's name)

    model, args, _ = public_models.MODELS[name].build()
    fast = torch.compile(model.eval(), backend="ascendfuse", options={"target": TARGET})

    def call():
        with torch.no_grad():
            return fast(*args)
    call()
    return call


def _setup_onnx(name: str):
    import numpy as np
    import tvm
    from tvm import relax

    import public_models
    import tvm_ascendfuse as af
    from tvm_ascendfuse.frontend import import_onnx

    path = public_models.export(name, log=lambda *a: None)
    _, args, _ = public_models.MODELS[name].build()
    res = af.compile_model(import_onnx(str(path)), target=TARGET)
    fn = relax.VirtualMachine(res.executable, tvm.cpu())["main"]
    xs = [tvm.runtime.tensor(np.ascontiguousarray(a.numpy())) for a in args]
    return lambda: fn(*xs)


def worker(which: str, name: str) -> None:
    t = time.perf_counter()
    call = (_setup_compile if which == "compile" else _setup_onnx)(name)
    print(json.dumps({"ready": True, "setup_s": time.perf_counter() - t}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            return
        print(json.dumps({"best_s": _round(call, cmd["round_s"])}), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="resnet50")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--round-s", type=float, default=3.0)
    ap.add_argument("--worker", choices=["compile", "onnx"], help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts.worker:
        worker(opts.worker, opts.model)
        return 0
    procs = {}
    for which in ("compile", "onnx"):   # built one after the other: the builds use every core
        p = subprocess.Popen([sys.executable, __file__, opts.model, "--worker", which], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        ready = json.loads(p.stdout.readline())
        print(f"{which}: set up in {ready['setup_s']:.1f} s", flush=True)
        procs[which] = p
    best = {k: float("inf") for k in procs}
    ratios = []
    for r in range(opts.rounds):
        this = {}
        for which, p in procs.items():
            p.stdin.write(json.dumps({"op": "round", "round_s": opts.round_s}) + "\n")
            p.stdin.flush()
            this[which] = json.loads(p.stdout.readline())["best_s"]
            best[which] = min(best[which], this[which])
        ratios.append(this["compile"] / this["onnx"])
        print(f"round {r + 1}: torch.compile {this['compile'] * 1e3:.2f} ms, ONNX path {this['onnx'] * 1e3:.2f} ms",
              flush=True)
    for p in procs.values():
        p.stdin.write(json.dumps({"op": "quit"}) + "\n")
        p.stdin.flush()
        p.wait(timeout=60)
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
    # the median of the rounds' ratios pairs times taken seconds apart (a shared host's load moves between
    # rounds); the ratio of the best times shows what each reached in its quietest round
    median = sorted(ratios)[len(ratios) // 2]
    print(f"{opts.model}: torch.compile / ONNX path = {median:.3f} (median of {opts.rounds} rounds' ratios); "
          f"best {best['compile'] * 1e3:.2f} ms vs {best['onnx'] * 1e3:.2f} ms "
          f"(ratio {best['compile'] / best['onnx']:.3f}); loadavg {' '.join(load)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
