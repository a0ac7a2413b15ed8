"""Greedy generation, ours vs ONNX Runtime: a prompt's prefill, then decode steps with the KV cache fed back.

    python benchmarks/generate_benchmark.py llama qwen2 gpt2 [--prompt 128] [--steps 128] [--rounds 3]

Each model is two exports (``public_models``): ``<name>_lm_prefill<P>`` (P prompt tokens, no cache) and
``<name>_lm_step`` (one token, the cache length a symbolic dim: one build serves every step). Both are
compiled once with our pipeline in a worker process (``model_benchmark``'s compile worker); then each
runtime runs whole generations in a process of its own, alternating (ours, ORT, ours, ...), ``--rounds``
times. A generation: the prefill gives the first token (the argmax of the last position's logits), each
decode step feeds the token and the cache the previous call returned and gives the next one; ours keeps the
cache in TVM tensors, ORT in OrtValues (``run_with_ort_values``), so neither copies it between steps.

Reported, minimum over rounds: prefill time, time per decode step, tokens/s over the whole generation
(1 + steps tokens), ours/ORT of the whole generation, and how many generated tokens the two runtimes agree
on before the first difference (random weights: a near tie in the logits can flip a greedy choice).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

ORT_THREADS = 2


def _prompt(length: int, vocab: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=(1, length), dtype=np.int64)


def _int_high(path) -> int:
    import public_models
    from tvm_ascendfuse.frontend import load_onnx

    meta = {p.key: p.value for p in load_onnx(str(path)).metadata_props}
    return int(meta[public_models.INT_HIGH_KEY])


# ---------------------------------------------------------------------------------------------------------
# The worker: one runtime, whole generations

class _Ours:
    def __init__(self, prefill_lib: str, step_lib: str):
        import tvm
        from tvm import relax

        self.tvm = tvm
        self.prefill = relax.VirtualMachine(tvm.runtime.load_module(prefill_lib), tvm.cpu())["main"]
        self.step = relax.VirtualMachine(tvm.runtime.load_module(step_lib), tvm.cpu())["main"]

    def run_prefill(self, ids: np.ndarray):
        logits, *cache = self.prefill(self.tvm.runtime.tensor(ids))
        return int(logits.numpy().argmax()), cache

    def run_step(self, token: int, cache):
        logits, *cache = self.step(self.tvm.runtime.tensor(np.array([[token]], dtype=np.int64)), *cache)
        return int(logits.numpy().argmax()), cache


class _Ort:
    def __init__(self, prefill_onnx: str, step_onnx: str):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = ORT_THREADS
        self.ort = ort
        self.prefill = ort.InferenceSession(prefill_onnx, so, providers=["CPUExecutionProvider"])
        self.step = ort.InferenceSession(step_onnx, so, providers=["CPUExecutionProvider"])
        self.step_inputs = [i.name for i in self.step.get_inputs()]
        self.prefill_outputs = [o.name for o in self.prefill.get_outputs()]
        self.step_outputs = [o.name for o in self.step.get_outputs()]

    def _value(self, array):
        return self.ort.OrtValue.ortvalue_from_numpy(array)

    def run_prefill(self, ids: np.ndarray):
        name = self.prefill.get_inputs()[0].name
        logits, *cache = self.prefill.run_with_ort_values(self.prefill_outputs, {name: self._value(ids)})
        return int(logits.numpy().argmax()), cache

    def run_step(self, token: int, cache):
        feeds = dict(zip(self.step_inputs, [self._value(np.array([[token]], dtype=np.int64)), *cache]))
        logits, *cache = self.step.run_with_ort_values(self.step_outputs, feeds)
        return int(logits.numpy().argmax()), cache


def generate(rt, prompt: np.ndarray, steps: int) -> dict:
    """One greedy generation: its tokens, the prefill's and the decode steps' wall times."""
    t0 = time.perf_counter()
    token, cache = rt.run_prefill(prompt)
    t1 = time.perf_counter()
    tokens = [token]
    for _ in range(steps):
        token, cache = rt.run_step(token, cache)
        tokens.append(token)
    t2 = time.perf_counter()
    return {"tokens": tokens, "prefill_s": t1 - t0, "decode_s": t2 - t1}


def worker(a) -> int:
    rt = _Ours(a.prefill_lib, a.step_lib) if a.which == "ours" else _Ort(a.prefill, a.step)
    prompt = _prompt(a.prompt, a.vocab)
    generate(rt, prompt, min(a.steps, 4))          # warm: first calls, allocations, thread pools
    runs = [generate(rt, prompt, a.steps) for _ in range(a.repeats)]
    best = min(runs, key=lambda r: r["prefill_s"] + r["decode_s"])
    with open(a.result, "w") as f:
        json.dump(best, f)
    return 0


# ---------------------------------------------------------------------------------------------------------
# The parent

def _compile(path: Path, workdir: Path) -> str:
    from model_benchmark import run_job

    res = run_job("compile", path, workdir, timeout=3600, which="ours")
    if "lib" not in res:
        raise SystemExit(f"compiling {path.name} failed: {res.get('error') or res}")
    lib = workdir / f"{path.stem}.so"
    os.replace(res["lib"], lib)
    print(f"  compiled {path.name}: {res['kernels']} launches, {res['compile_s']:.1f} s", flush=True)
    return str(lib)


def _generation(which: str, paths: dict, libs: dict, args, vocab: int, workdir: Path) -> dict:
    import subprocess

    result = workdir / f"gen_{which}_{time.monotonic_ns()}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--which", which,
           "--prefill", str(paths["prefill"]), "--step", str(paths["step"]), "--prompt", str(args.prompt),
           "--steps", str(args.steps), "--vocab", str(vocab), "--repeats", str(args.repeats),
           "--result", str(result)]
    if which == "ours":
        cmd += ["--prefill-lib", libs["prefill"], "--step-lib", libs["step"]]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not result.is_file():
        raise SystemExit(f"{which} generation failed:\n{proc.stderr[-2000:]}")
    return json.loads(result.read_text())


def _agreeing(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def benchmark(name: str, args, workdir: Path) -> dict:
    import public_models

    paths = {"prefill": public_models.export(f"{name}_lm_prefill{args.prompt}", log=print),
             "step": public_models.export(f"{name}_lm_step", log=print)}
    vocab = _int_high(paths["step"])
    libs = {k: _compile(p, workdir) for k, p in paths.items()}
    best: dict = {}
    for r in range(args.rounds):
        for which in ("ours", "ort"):
            run = _generation(which, paths, libs, args, vocab, workdir)
            total = run["prefill_s"] + run["decode_s"]
            if which not in best or total < best[which]["prefill_s"] + best[which]["decode_s"]:
                best[which] = run
        print(f"  round {r + 1}: ours {_total(best['ours']) * 1e3:.0f} ms, ORT {_total(best['ort']) * 1e3:.0f} ms",
              flush=True)
    return {"model": name, "prompt": args.prompt, "steps": args.steps, **{
        which: {"prefill_ms": run["prefill_s"] * 1e3, "step_ms": run["decode_s"] * 1e3 / max(1, args.steps),
                "tokens_per_s": len(run["tokens"]) / _total(run)} for which, run in best.items()},
        "ratio": _total(best["ours"]) / _total(best["ort"]),
        "tokens_agree": _agreeing(best["ours"]["tokens"], best["ort"]["tokens"]),
        "tokens": len(best["ours"]["tokens"])}


def _total(run: dict) -> float:
    return run["prefill_s"] + run["decode_s"]


def table(rows: list[dict]) -> str:
    head = (f"{'model':8} {'prompt':>6} {'steps':>5} | {'prefill ms ours/ORT':>20} | {'step ms ours/ORT':>17} | "
            f"{'tok/s ours/ORT':>15} | {'ours/ORT':>8} | tokens equal")
    lines = [head, "-" * len(head)]
    for r in rows:
        o, t = r["ours"], r["ort"]
        lines.append(f"{r['model']:8} {r['prompt']:>6} {r['steps']:>5} | {o['prefill_ms']:9.1f} / {t['prefill_ms']:8.1f} "
                     f"| {o['step_ms']:7.2f} / {t['step_ms']:7.2f} | {o['tokens_per_s']:6.0f} / {t['tokens_per_s']:6.0f} "
                     f"| {r['ratio']:7.2f}x | {r['tokens_agree']} of {r['tokens']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--worker" in argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--worker", action="store_true")
        for flag in ("--which", "--prefill", "--step", "--prefill-lib", "--step-lib", "--result"):
            ap.add_argument(flag)
        for flag in ("--prompt", "--steps", "--vocab", "--repeats"):
            ap.add_argument(flag, type=int)
        return worker(ap.parse_args(argv))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="llama, qwen2, gpt2 (public_models' *_lm_* exports)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (a <name>_lm_prefill<P> export)")
    ap.add_argument("--steps", type=int, default=128, help="decode steps after the prefill")
    ap.add_argument("--rounds", type=int, default=3, help="processes per runtime, alternating")
    ap.add_argument("--repeats", type=int, default=2, help="timed generations per process")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    import tvm

    print(f"host CPU: {tvm.target.codegen.llvm_get_system_cpu()}, {os.cpu_count()} cores; ORT with "
          f"{ORT_THREADS} intra-op threads", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="generate_bench_") as tmp:
        for name in args.models:
            print(f"{name}: prompt {args.prompt}, {args.steps} decode steps", flush=True)
            rows.append(benchmark(name, args, Path(tmp)))
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
