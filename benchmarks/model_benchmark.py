"""Any ONNX model through tvm_ascendfuse vs TVM's default pipeline vs onnxruntime: builds, kernels per rule,
generic-rule kernels against onnxruntime on the same ops, compile time, agreement, natural-loop speed.

    python benchmarks/model_benchmark.py resnet18 gpt2 W3 path/to/model.onnx --json out.json
    python benchmarks/model_benchmark.py all --json baseline.json        # public-model set + W1..W7
    python benchmarks/model_benchmark.py --from-json baseline.json      # the tables again, from the JSON

Arguments: names of ``public_models.MODELS`` (exported into its cache on first use; needs the ``models``
extra), built-in workload ids W1..W7 (written as ONNX into the same cache), or ONNX files.

Per model, every step in a process of its own (a crash, a hang or a thread pool cannot touch the others):

1. **compile**: TVM's default pipeline (``tvm.compile(mod, target=host, relax_pipeline=
   relax.get_default_pipeline(host))``, as ``compile_time.py``) and ``compile_model(mod, "ascend910b")``,
   each in a fresh process after a warm-up compile of a tiny model (LLVM's one-time start-up is not
   counted), the two alternating over ``--compile-rounds``, min kept; a process over ``--compile-timeout``
   is killed and reported as "> N s", an error as its last line. Ours builds its kernels on the host's idle
   cores (``tvm_ascendfuse/build.py``), TVM on one thread, as a user gets them. Kernel counts are launches
   after FuseTIR (default: ``fusion_benchmark.default_fused_module``); ours per schedule rule from the
   fusion report. When ours times out, ``--diagnose`` re-runs it phase by phase and then builds each kernel's
   TIR/LLVM alone, with a per-step timeout, to name the phase or the kernels that do not finish.
2. **agreement**: one call of each library and of onnxruntime, each in its own process, on the same
   seeded inputs (``profile_kernels.model_inputs``); error = max|a - b| / max|b| over each output (b: ORT),
   the largest over outputs; "ok" when below ``--tol`` (1e-3). TVM default's call is skipped past
   ``--default-run-timeout`` (untuned default kernels take seconds to minutes on the large models).
3. **speed, ours / ORT**: two worker processes that stay loaded, ours (the exported library in a Relax VM,
   ``TVM_NUM_THREADS=2``) and onnxruntime (all graph optimisations, 2 intra-op threads); the parent tells
   them in turn ours, ORT, ours, ORT ... (``--rounds``, at least 3) to run one round: a warm call, then calls
   of the natural loop ``out = f(x)`` (ours: ``vm["main"](*x)`` on tvm tensors made once; ORT:
   ``sess.run(None, feeds)`` on numpy arrays) until ~``--round-ms`` passed (at least 5 calls), each call
   timed, the minimum kept. The ratio is of the minima over rounds. A worker waits on a pipe while the
   other runs (TVM's pool spin count is lowered so idle workers sleep).
4. **per-kernel profile** (ours worker, after the rounds): every kernel call timed alone
   (``profile_kernels.profile_executable``): share of our per-kernel time per rule; the generic-rule
   kernels (fallback, reduction, elementwise, unscheduled) listed with their source ops and shapes.
5. **ORT on the same ops** (``--same-ops``, default on): for each generic-rule kernel, up to
   ``--same-ops-calls`` of its calls matched by tensor values to a subgraph of the ONNX model, which
   onnxruntime runs alone (``ort_same_ops.py`` has the method and its limits: unmatched kernels say why).
   Ratio = our kernel's per-call time / ORT's node-kernel time for those ops.

All times are host-CPU wall clock, not NPU times; on a shared machine they are inflated and noisy (the
load average before and after each model's timing is in the JSON). Compile times measured while other
processes run are inflated too; ours then also gets fewer build threads.
"""

from __future__ import annotations

import os

os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "1000")
os.environ.setdefault("TVM_NUM_THREADS", "2")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import select  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GENERIC_RULES = ("fallback", "reduction", "elementwise", "unscheduled")
ORT_THREADS = 2
TARGET = "ascend910b"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def one_line(err: BaseException | str) -> str:
    """The line of an error that says what went wrong (TVM errors end with it, Python ones start with it)."""
    text = str(err).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__ if isinstance(err, BaseException) else "error"
    pick = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1])
    prefix = f"{type(err).__name__}: " if isinstance(err, BaseException) and type(err).__name__ not in pick else ""
    return (prefix + pick)[:400]


# ---------------------------------------------------------------------------------------------------------
# Sources

def resolve(arg: str, cache: Path | None, force_export: bool = False) -> tuple[str, Path, str]:
    """(label, onnx path, kind) for a public-model name, a workload id or an ONNX path."""
    from tvm_ascendfuse.workloads import WORKLOAD_IDS, WORKLOADS

    import public_models

    folder = Path(cache) if cache else public_models.cache_dir()
    if arg.upper() in WORKLOAD_IDS:
        wid = arg.upper()
        path = folder / "workloads" / f"{wid}_{WORKLOAD_IDS[wid]}.onnx"
        if not path.is_file():
            import onnx

            path.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(WORKLOADS[WORKLOAD_IDS[wid]][0](), str(path))
        return wid, path, "workload"
    if arg in public_models.MODELS:
        return arg, public_models.export(arg, folder, force_export, log=log), "public"
    path = Path(arg)
    if path.suffix == ".onnx" or path.is_file():
        return path.stem, path, "file"
    raise SystemExit(f"error: '{arg}' is neither a public model ({', '.join(public_models.MODELS)}), "
                     f"a workload id (W1..W{len(WORKLOAD_IDS)}) nor an ONNX file")


def expand(args: list[str]) -> list[str]:
    from tvm_ascendfuse.workloads import WORKLOAD_IDS

    import public_models

    out = []
    for a in args:
        if a == "all":
            out += list(public_models.MODELS) + list(WORKLOAD_IDS)
        elif a == "public":
            out += list(public_models.MODELS)
        elif a == "workloads":
            out += list(WORKLOAD_IDS)
        else:
            out.append(a)
    return out


def load_inputs(model, seed: int, int_high: int | None) -> list[np.ndarray]:
    from profile_kernels import model_inputs

    return model_inputs(model, seed, int_high)


# ---------------------------------------------------------------------------------------------------------
# Workers (run as `model_benchmark.py --worker MODE ...` in their own processes)

def _warm_compile(which: str) -> None:
    """Pay LLVM's and TVM's one-time start-up before the timed compile (as compile_time.py does)."""
    import tvm
    from tvm import relax

    import tvm_ascendfuse as af
    from tvm_ascendfuse.frontend import import_onnx
    from tvm_ascendfuse.workloads import WORKLOADS

    warm = import_onnx(WORKLOADS["mlp3"][0](rows=4, width=32))
    host = af.get_target(TARGET).host_target(portable=False)
    if which == "default":
        tvm.compile(warm, target=host, relax_pipeline=relax.get_default_pipeline(host))
    else:
        af.compile_model(warm, target=TARGET, portable=False)


def worker_compile(which: str, onnx_path: str, workdir: str, precision_mode: str | None = None,
                   fusion_switch: str | None = None) -> dict:
    import tvm
    from tvm import relax

    import tvm_ascendfuse as af
    from tvm_ascendfuse.analysis import launch_count
    from tvm_ascendfuse.build import default_jobs
    from tvm_ascendfuse.frontend import import_onnx

    _warm_compile(which)
    t = time.perf_counter()
    mod = import_onnx(onnx_path)
    import_s = time.perf_counter() - t
    host = af.get_target(TARGET).host_target(portable=False)
    out: dict = {"import_s": import_s}
    lib = os.path.join(workdir, f"{which}.so")
    if which == "default":
        from fusion_benchmark import default_fused_module

        t = time.perf_counter()
        ex = tvm.compile(mod, target=host, relax_pipeline=relax.get_default_pipeline(host))
        out["compile_s"] = time.perf_counter() - t
        out["kernels"] = launch_count(default_fused_module(mod, host))
    else:
        from profile_kernels import static_kernel_info

        out["jobs"] = default_jobs(host)
        t = time.perf_counter()
        res = af.compile_model(mod, target=TARGET, portable=False, precision_mode=precision_mode,
                               switches=fusion_switch)
        out["compile_s"] = time.perf_counter() - t
        ex = res.executable
        out["kernels"] = launch_count(res.fused_module)
        try:
            out["info"] = static_kernel_info(res)
        except Exception as err:  # noqa: BLE001 - the build stands; the kernel columns are missing
            out["info_error"] = one_line(err)
            out["info_trace"] = traceback.format_exc()[-3000:]
    ex.export_library(lib)
    out["lib"] = lib
    return out


class _Loaded:
    """One runtime in a worker: ``call()`` runs the natural loop body once; ``outputs()`` the last result."""

    def __init__(self, which: str, onnx_path: str, lib: str | None, seed: int, int_high: int | None):
        from tvm_ascendfuse.frontend import load_onnx

        self.model = load_onnx(onnx_path)
        self.inputs = load_inputs(self.model, seed, int_high)
        self.which = which
        if which == "reference":
            # the model's own semantics, what ``--verify`` checks against: graph optimisations off, integer
            # sums exact (ORT's optimised int8 kernels on a CPU without VNNI saturate)
            import onnxruntime as ort
            from tvm_ascendfuse.verify import exact_integer_ops, reference_session_options

            self.sess = ort.InferenceSession(exact_integer_ops(self.model).SerializeToString(),
                                             reference_session_options(), providers=["CPUExecutionProvider"])
            self.feeds = {i.name: a for i, a in zip(self.sess.get_inputs(), self.inputs)}
            self.f = lambda: self.sess.run(None, self.feeds)
        elif which == "ort":
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            so.intra_op_num_threads = ORT_THREADS
            self.sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
            self.feeds = {i.name: a for i, a in zip(self.sess.get_inputs(), self.inputs)}
            self.f = lambda: self.sess.run(None, self.feeds)
        else:
            import tvm
            from tvm import relax

            self.lib = tvm.runtime.load_module(lib)
            self.vm = relax.VirtualMachine(self.lib, tvm.cpu())
            fn = self.vm["main"]
            xs = [tvm.runtime.tensor(a) for a in self.inputs]
            self.f = lambda: fn(*xs)
        self.last = None

    def call(self):
        self.last = self.f()

    def outputs(self) -> list[np.ndarray]:
        out = self.last
        if self.which in ("ort", "reference"):
            return [np.asarray(o) for o in out]
        if hasattr(out, "numpy"):
            return [out.numpy()]
        return [o.numpy() for o in out]

    def round(self, round_s: float, min_calls: int) -> dict:
        """A warm call, then natural-loop calls for ~round_s (at least min_calls), each timed."""
        self.call()
        times = []
        start = time.perf_counter()
        while len(times) < min_calls or time.perf_counter() - start < round_s:
            t = time.perf_counter()
            self.last = self.f()
            times.append(time.perf_counter() - t)
        return {"min_ms": min(times) * 1e3, "median_ms": float(np.median(times)) * 1e3, "calls": len(times)}


def worker_run(which: str, onnx_path: str, lib: str | None, workdir: str, seed: int, int_high: int | None) -> None:
    """Stay loaded; one JSON command a line on stdin, one JSON answer a line on stdout."""
    rt = _Loaded(which, onnx_path, lib, seed, int_high)
    reply = lambda obj: (sys.stdout.write(json.dumps(obj) + "\n"), sys.stdout.flush())  # noqa: E731
    reply({"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "output":
                t = time.perf_counter()
                rt.call()
                first = time.perf_counter() - t
                path = os.path.join(workdir, f"out_{which}.npz")
                np.savez(path, *rt.outputs())
                reply({"path": path, "first_call_s": first})
            elif cmd["op"] == "round":
                reply(rt.round(cmd["round_s"], cmd["min_calls"]))
            elif cmd["op"] == "profile":
                reply(_profile(rt, cmd, workdir))
            elif cmd["op"] == "quit":
                return
        except Exception as err:  # noqa: BLE001 - the parent records the error and goes on
            reply({"error": one_line(err), "trace": traceback.format_exc()[-2000:]})


def _profile(rt: _Loaded, cmd: dict, workdir: str) -> dict:
    from profile_kernels import capture_calls, profile_executable

    info = json.load(open(cmd["info"]))["info"]
    rows = profile_executable(rt.lib, rt.inputs, info, cmd.get("kernel_rounds", 3))
    out = {"kernels": [{"name": k.name, "rule": k.rule, "calls": k.calls, "ms": k.ms, "gflops": k.gflops}
                       for k in rows]}
    generic = [k.name for k in rows if k.rule in GENERIC_RULES][: cmd.get("max_kernels", 60)]
    if cmd.get("capture") and generic:
        plan = {k: {"n_inputs": info[k]["n_inputs"], "const": info[k]["const"], "max_calls": cmd["max_calls"]}
                for k in generic}
        calls = capture_calls(rt.lib, rt.inputs, plan)
        arrays, index = {}, []
        for j, c in enumerate(calls):
            entry = {"kernel": c["kernel"], "call": c["call"], "inputs": [], "outputs": []}
            for part in ("inputs", "outputs"):
                for i, a in enumerate(c[part]):
                    key = f"c{j}_{part[0]}{i}"
                    arrays[key] = a
                    entry[part].append(key)
            index.append(entry)
        path = os.path.join(workdir, "captured.npz")
        np.savez(path, **arrays)
        out["captured"] = {"path": path, "index": index}
    return out


def worker_same_ops(onnx_path: str, captured: str, seed: int, int_high: int | None, runs: int) -> dict:
    from ort_same_ops import ort_same_ops

    from tvm_ascendfuse.frontend import load_onnx

    model = load_onnx(onnx_path)
    inputs = load_inputs(model, seed, int_high)
    inits = {t.name for t in model.graph.initializer}
    feeds = {g.name: a for g, a in zip([g for g in model.graph.input if g.name not in inits], inputs)}
    cap = json.load(open(captured))
    arrays = np.load(cap["path"])
    calls = [{"kernel": e["kernel"], "inputs": [arrays[k] for k in e["inputs"]],
              "outputs": [arrays[k] for k in e["outputs"]]} for e in cap["index"]]
    return {"rows": ort_same_ops(model, feeds, calls, runs=runs, log=log)}


def worker_diagnose(onnx_path: str, skip: list[str]) -> None:
    """Stream (one JSON a line) the time of each pipeline phase, then of each kernel's TIR/LLVM build alone;
    the parent kills this process when a step exceeds its timeout and restarts it skipping that kernel."""
    import tvm
    from tvm import relax
    from tvm.relax import vm_build

    import tvm_ascendfuse as af
    from tvm_ascendfuse.build import _build_context
    from tvm_ascendfuse.frontend import import_onnx
    from tvm_ascendfuse.pipeline import AscendFusePipeline

    emit = lambda obj: (sys.stdout.write(json.dumps(obj) + "\n"), sys.stdout.flush())  # noqa: E731
    npu = af.get_target(TARGET)
    host = npu.host_target(portable=False)

    def step(name: str, fn, **extra):
        emit({"step": name, "start": True, **extra})
        t = time.perf_counter()
        try:
            value = fn()
        except Exception as err:  # noqa: BLE001 - named in the diagnosis, then the next step
            emit({"step": name, "error": one_line(err), **extra})
            return None, False
        emit({"step": name, "s": time.perf_counter() - t, **extra})
        return value, True

    mod, ok = step("phase:import", lambda: import_onnx(onnx_path))
    if not ok:
        return
    pipe = AscendFusePipeline(npu)
    target, switches, tvm_target = pipe.resolve()
    with host:
        for name, passes in pipe.phases(target, switches, host):
            mod, ok = step(f"phase:{name}", lambda m=mod, p=passes: tvm.transform.Sequential(p)(m))
            if not ok:
                return
    rules = pipe.report.sections.get("schedules", {})
    builder = relax.ExecBuilder()
    tir_mod = vm_build._filter_tir(vm_build._vmcodegen(builder, mod, "bytecode"))
    funcs = sorted(tir_mod.functions.items(), key=lambda kv: kv[0].name_hint)
    emit({"kernels": len(funcs)})

    def build_one(gv, func):
        with _build_context():
            return tvm.tirx.build(tvm.IRModule({gv: func}, attrs=tir_mod.attrs), target=host, pipeline="default")

    for gv, func in funcs:
        if gv.name_hint not in skip:
            step(f"kernel:{gv.name_hint}", lambda g=gv, f=func: build_one(g, f), rule=rules.get(gv.name_hint, "-"))
    emit({"done": True})


def worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--which", default="ours")
    ap.add_argument("--lib", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--int-high", type=int, default=None)
    ap.add_argument("--result", default=None)
    ap.add_argument("--captured", default=None)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--skip", default="")
    ap.add_argument("--precision-mode", default=None)
    ap.add_argument("--fusion-switch", default=None)
    a = ap.parse_args(argv)
    if a.worker == "run":
        worker_run(a.which, a.onnx, a.lib, a.workdir, a.seed, a.int_high)
        return 0
    if a.worker == "diagnose":
        worker_diagnose(a.onnx, [s for s in a.skip.split(",") if s])
        return 0
    try:
        if a.worker == "compile":
            res = worker_compile(a.which, a.onnx, a.workdir, a.precision_mode, a.fusion_switch)
        elif a.worker == "same_ops":
            res = worker_same_ops(a.onnx, a.captured, a.seed, a.int_high, a.runs)
        else:
            raise ValueError(f"unknown worker {a.worker}")
    except Exception as err:  # noqa: BLE001 - reported as one line by the parent
        res = {"error": one_line(err), "trace": traceback.format_exc()[-4000:]}
    with open(a.result, "w") as f:
        json.dump(res, f, default=str)
    return 0


# ---------------------------------------------------------------------------------------------------------
# The parent: processes

def _cmd(worker: str, onnx_path, workdir, **kw) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", worker, "--onnx", str(onnx_path),
           "--workdir", str(workdir)]
    for k, v in kw.items():
        if v is not None:
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


def _kill(proc: subprocess.Popen) -> None:
    """End a worker this script started, and its children (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_job(worker: str, onnx_path, workdir, timeout: float, **kw) -> dict:
    """A one-shot worker; its JSON result, or {'timeout': s} / {'error': line}."""
    result = os.path.join(workdir, f"{worker}_{kw.get('which', '')}_{time.monotonic_ns()}.json")
    errlog = open(os.path.join(workdir, f"{worker}_{kw.get('which', '')}.log"), "a")
    t = time.perf_counter()
    proc = subprocess.Popen(_cmd(worker, onnx_path, workdir, result=result, **kw), stdout=errlog,
                            stderr=errlog, start_new_session=True)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return {"timeout": timeout}
    finally:
        errlog.close()
    if not os.path.exists(result):
        tail = open(os.path.join(workdir, f"{worker}_{kw.get('which', '')}.log")).read().strip().splitlines()
        return {"error": f"worker died (exit {proc.returncode}): {(tail or ['no output'])[-1][:300]}",
                "wall_s": time.perf_counter() - t}
    with open(result) as f:
        out = json.load(f)
    out["wall_s"] = time.perf_counter() - t
    return out


class Worker:
    """A runtime loaded in its own process, answering one JSON command at a time."""

    def __init__(self, which: str, onnx_path, workdir, lib=None, seed=0, int_high=None, timeout=600.0):
        self.which = which
        self.err = open(os.path.join(workdir, f"run_{which}.log"), "a")
        self.proc = subprocess.Popen(_cmd("run", onnx_path, workdir, which=which, lib=lib, seed=seed,
                                          int_high=int_high), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True, start_new_session=True)
        self.ready = self._read(timeout)

    def _read(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            return {"timeout": timeout}
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            return {"error": f"{self.which} worker exited ({code})"}
        return json.loads(line)

    def ask(self, timeout: float, **cmd) -> dict:
        if self.proc.poll() is not None:
            return {"error": f"{self.which} worker is not running"}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                _kill(self.proc)
        self.err.close()


def diagnose(onnx_path, workdir, step_timeout: float, max_restarts: int = 4) -> dict:
    """Phase and per-kernel build times of our compile; steps over ``step_timeout`` are named and skipped."""
    done: dict[str, dict] = {}
    hung: list[dict] = []
    failed: list[dict] = []
    phases: dict[str, float] = {}
    for _ in range(max_restarts + 1):
        skip = [s.split(":", 1)[1] for s in list(done) + [h["step"] for h in hung] if s.startswith("kernel:")]
        err = open(os.path.join(workdir, "diagnose.log"), "a")
        proc = subprocess.Popen(_cmd("diagnose", onnx_path, workdir, skip=",".join(skip)),
                                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        current, finished = None, False
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], step_timeout)
            if not ready:
                if current and current["step"].startswith("phase:"):
                    hung.append({"step": current["step"], "over_s": step_timeout})
                    _kill(proc)
                    err.close()
                    return {"phases": phases, "kernels": done, "hung": hung, "stopped_at": current["step"]}
                hung.append({"step": current["step"] if current else "?", "over_s": step_timeout,
                             "rule": (current or {}).get("rule")})
                _kill(proc)
                break
            line = proc.stdout.readline()
            if not line:
                proc.wait()
                if not finished:
                    hung.append({"step": current["step"] if current else "?", "error": f"exit {proc.returncode}"})
                break
            msg = json.loads(line)
            if msg.get("done"):
                finished = True
            elif "error" in msg:
                failed.append({"step": msg["step"], "error": msg["error"], "rule": msg.get("rule")})
                if msg["step"].startswith("phase:"):
                    _kill(proc)
                    err.close()
                    return {"phases": phases, "failed": failed, "hung": hung, "stopped_at": msg["step"]}
                done[msg["step"]] = {"s": None, "rule": msg.get("rule"), "error": msg["error"]}
                current = None
            elif "start" in msg:
                current = msg
            elif "s" in msg:
                if msg["step"].startswith("phase:"):
                    phases[msg["step"][6:]] = round(msg["s"], 2)
                else:
                    done[msg["step"]] = {"s": round(msg["s"], 2), "rule": msg.get("rule")}
                current = None
        err.close()
        if finished or (hung and not hung[-1]["step"].startswith("kernel:")):
            break
    slowest = sorted(((k, v) for k, v in done.items() if v["s"] is not None), key=lambda kv: -kv[1]["s"])[:10]
    return {"phases": phases, "hung": hung, "failed": failed, "kernels_built": len(done),
            "slowest_kernels": [{"kernel": k[7:], **v} for k, v in slowest]}


# ---------------------------------------------------------------------------------------------------------
# The parent: one model

def rel_err(ours: list[np.ndarray], ref: list[np.ndarray]) -> float | None:
    if len(ours) != len(ref):
        return None
    worst = 0.0
    for a, b in zip(ours, ref):
        a = np.asarray(a, dtype=np.float64).reshape(-1)
        b = np.asarray(b, dtype=np.float64).reshape(-1)
        if a.size != b.size:
            return None
        scale = float(np.max(np.abs(b))) if b.size else 0.0
        diff = float(np.max(np.abs(a - b))) if b.size else 0.0
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


QUANTIZED_ONNX_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                      "ConvInteger", "QLinearConv", "QLinearMatMul"}


def is_quantized_onnx(path: str) -> bool:
    """A quantized model: judged by cosine (``verify.QUANT_COSINE``), as ``--verify`` judges it, since two
    correct runtimes round values on a quantization boundary differently and the step propagates."""
    import onnx

    return any(n.op_type in QUANTIZED_ONNX_OPS for n in onnx.load(path, load_external_data=False).graph.node)


def cosine_of(ours: list[np.ndarray], ref: list[np.ndarray]) -> float | None:
    """The smallest cosine similarity over the float outputs."""
    from tvm_ascendfuse.verify import cosine

    if len(ours) != len(ref):
        return None
    return min((cosine(np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel())
                for a, b in zip(ours, ref) if np.asarray(b).dtype.kind == "f"), default=None)


def _outputs(path: str) -> list[np.ndarray]:
    z = np.load(path)
    return [z[f"arr_{i}"] for i in range(len(z.files))]


def benchmark_model(arg: str, opts, cache: Path | None) -> dict:
    label, path, kind = resolve(arg, cache)
    import public_models

    row: dict = {"model": label, "kind": kind, "onnx": str(path), "notes": []}
    if label in public_models.MODELS:
        row["description"] = public_models.MODELS[label].description
        if label in public_models.KNOWN_TVM_FAILURES:
            row["notes"].append("TVM 0.27's own pipeline is known to fail on this model")
    elif kind == "workload":
        from tvm_ascendfuse.workloads import WORKLOAD_IDS, WORKLOADS

        row["description"] = WORKLOADS[WORKLOAD_IDS[label]][1]
    if opts.workdir:
        Path(opts.workdir).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"mb_{label}_", dir=opts.workdir))
    try:
        _benchmark(row, path, workdir, opts)
    finally:
        if not opts.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            row["workdir"] = str(workdir)
    return row


def _compile_cell(res: dict) -> dict:
    if "timeout" in res:
        return {"built": False, "error": f"compile > {res['timeout']:.0f} s (killed)"}
    if "error" in res:
        return {"built": False, "error": res["error"]}
    return {"built": True}


def _benchmark(row: dict, path: Path, workdir: Path, opts) -> None:
    # 1. compiles, alternating
    comp: dict[str, list[dict]] = {"default": [], "ours": []}
    for r in range(opts.compile_rounds):
        order = ("default", "ours") if r % 2 == 0 else ("ours", "default")
        for which in order:
            if comp[which] and not comp[which][-1].get("compile_s"):
                continue       # it failed once: do not repeat a timeout
            log(f"[{row['model']}] compile {which} (round {r + 1}) ...")
            timeout = opts.compile_timeout if which == "ours" else opts.default_compile_timeout
            mode = opts.precision_mode if which == "ours" else None
            switch = opts.fusion_switch if which == "ours" else None
            comp[which].append(run_job("compile", path, workdir, timeout, which=which, precision_mode=mode,
                                       fusion_switch=switch))
    for which in ("default", "ours"):
        runs = comp[which]
        ok = [c for c in runs if c.get("compile_s")]
        cell = _compile_cell(runs[-1] if not ok else ok[-1])
        row[f"built_{which}"] = cell["built"]
        if not cell["built"]:
            row[f"error_{which}"] = cell["error"]
            if "timeout" in runs[-1]:
                row[f"compile_s_{which}"] = f"> {runs[-1]['timeout']:.0f}"
            continue
        best = min(ok, key=lambda c: c["compile_s"])
        row[f"compile_s_{which}"] = round(best["compile_s"], 3)
        row[f"import_s_{which}"] = round(best["import_s"], 3)
        row[f"kernels_{which}"] = best["kernels"]
        row[f"lib_{which}"] = best["lib"]
        if which == "ours":
            row["build_jobs_ours"] = best.get("jobs")
            if "info" in best:
                row["_info"] = best["info"]
            else:
                row["notes"].append(f"harness: kernel table unavailable: {best.get('info_error')}")
    if row.get("built_ours") and row.get("built_default"):
        row["compile_ratio"] = round(row["compile_s_ours"] / row["compile_s_default"], 2)
    if not row.get("built_ours") and opts.diagnose:
        log(f"[{row['model']}] ours failed: per-phase / per-kernel build diagnosis ...")
        row["diagnosis_ours"] = diagnose(path, workdir, opts.diagnose_step_timeout)
    info = row.pop("_info", None)
    if info is not None:
        _kernel_columns(row, info)

    # 2. agreement (each runtime in its own process)
    ort = Worker("ort", path, workdir, seed=opts.seed, int_high=opts.int_high)
    if "error" in ort.ready or "timeout" in ort.ready:
        row["error_ort"] = ort.ready.get("error", "onnxruntime did not load in time")
        ort.close()
        return
    ort_ans = ort.ask(opts.run_timeout, op="output")
    refw = Worker("reference", path, workdir, seed=opts.seed, int_high=opts.int_high)
    ref_ans = refw.ask(opts.run_timeout, op="output") if "ready" in refw.ready else refw.ready
    refw.close()
    for ans in (ort_ans, ref_ans):
        if "path" not in ans:
            row["error_ort"] = ans.get("error") or f"first call > {opts.run_timeout:.0f} s"
            ort.close()
            return
    ref = _outputs(ref_ans["path"])
    quantized = is_quantized_onnx(path)
    if quantized:
        from tvm_ascendfuse.verify import QUANT_COSINE

        row["cosine_ort"] = cosine_of(_outputs(ort_ans["path"]), ref)
        if row["cosine_ort"] is not None and row["cosine_ort"] < QUANT_COSINE:
            row["notes"].append(f"onnxruntime's optimised run is off the model's own result: cosine "
                                f"{row['cosine_ort']:.4f} (its int8 kernels on this CPU)")
    ours = None
    if row.get("built_ours"):
        ours = Worker("ours", path, workdir, lib=row["lib_ours"], seed=opts.seed, int_high=opts.int_high)
        ans = ours.ask(opts.run_timeout, op="output") if "ready" in ours.ready else ours.ready
        if "path" in ans:
            row["rel_err_ours"] = rel_err(_outputs(ans["path"]), ref)
            if quantized:
                row["cosine_ours"] = cosine_of(_outputs(ans["path"]), ref)
                row["agrees_ours"] = row["cosine_ours"] is not None and row["cosine_ours"] >= QUANT_COSINE
            else:
                row["agrees_ours"] = row["rel_err_ours"] is not None and row["rel_err_ours"] <= opts.tol
        else:
            row["error_run_ours"] = ans.get("error") or f"first call > {opts.run_timeout:.0f} s"
            ours.close()
            ours = None
    if row.get("built_default") and not opts.no_default_run:
        log(f"[{row['model']}] TVM default: one call for agreement ...")
        dflt = Worker("default", path, workdir, lib=row["lib_default"], seed=opts.seed, int_high=opts.int_high)
        ans = dflt.ask(opts.default_run_timeout, op="output") if "ready" in dflt.ready else dflt.ready
        if "path" in ans:
            row["rel_err_default"] = rel_err(_outputs(ans["path"]), ref)
            row["agrees_default"] = row["rel_err_default"] is not None and row["rel_err_default"] <= opts.tol
            row["default_first_call_s"] = round(ans["first_call_s"], 3)
        else:
            row["notes"].append(f"TVM default not run for agreement: "
                                f"{ans.get('error') or f'one call > {opts.default_run_timeout:.0f} s'}")
        dflt.close()

    # 3. natural-loop rounds, ours / ORT alternating
    if ours is not None and info is None:
        ours.close()
        ours = None
    if ours is not None:
        load_before = os.getloadavg()
        mins: dict[str, list[float]] = {"ours": [], "ort": []}
        calls: dict[str, list[int]] = {"ours": [], "ort": []}
        for r in range(opts.rounds):
            for name, w in (("ours", ours), ("ort", ort)):
                time.sleep(0.03)
                ans = w.ask(opts.run_timeout, op="round", round_s=opts.round_ms / 1e3, min_calls=5)
                if "min_ms" not in ans:
                    row["notes"].append(f"timing round failed for {name}: {ans}")
                    break
                mins[name].append(ans["min_ms"])
                calls[name].append(ans["calls"])
        if mins["ours"] and mins["ort"]:
            row["ours_ms"] = min(mins["ours"])
            row["ort_ms"] = min(mins["ort"])
            row["ours_over_ort"] = row["ours_ms"] / row["ort_ms"]
            row["timing"] = {"rounds": len(mins["ours"]), "calls_per_round": {k: v for k, v in calls.items()},
                             "round_mins_ms": mins, "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
            weight_stream_note(row, path, getattr(opts, "bandwidth_gbps", None))

        # 4. per-kernel profile and 5. capture for ORT on the same ops
        log(f"[{row['model']}] per-kernel profile ...")
        info_path = workdir / "info.json"
        with open(info_path, "w") as f:
            json.dump({"info": info}, f)
        prof = ours.ask(opts.profile_timeout, op="profile", info=str(info_path), capture=opts.same_ops,
                        max_calls=opts.same_ops_calls, kernel_rounds=3)
        if "kernels" in prof:
            _profile_columns(row, prof["kernels"], info)
        else:
            row["notes"].append(f"per-kernel profile failed: {prof.get('error') or prof}")
        ours.close()
        ort.close()
        if prof.get("captured"):
            log(f"[{row['model']}] onnxruntime on the same ops of {len(row.get('generic_kernels', []))} "
                f"generic-rule kernels ...")
            cap_path = workdir / "captured.json"
            with open(cap_path, "w") as f:
                json.dump(prof["captured"], f)
            res = run_job("same_ops", path, workdir, opts.profile_timeout, captured=cap_path, seed=opts.seed,
                          int_high=opts.int_high)
            if "rows" in res:
                _same_ops_columns(row, res["rows"])
            else:
                row["notes"].append(f"ORT same-ops step failed: {res.get('error') or res}")
    else:
        ort.close()


def _kernel_columns(row: dict, info: dict) -> None:
    """Launches per rule and the generic-rule kernels (static: from the compile)."""
    per_rule: Counter = Counter()
    distinct: Counter = Counter()
    for name, k in info.items():
        n = len(k["n_inputs"])
        if n:
            per_rule[k["rule"]] += n
            distinct[k["rule"]] += 1
    row["launches_per_rule"] = dict(per_rule.most_common())
    row["distinct_kernels_per_rule"] = dict(distinct.most_common())
    row["generic_kernels"] = [
        {"name": name, "rule": k["rule"], "launches": len(k["n_inputs"]), "ops": k["ops"], "pattern": k["pattern"],
         "shapes": k["shapes"], "notes": k["notes"]}
        for name, k in info.items() if k["rule"] in GENERIC_RULES and k["n_inputs"]]


def _profile_columns(row: dict, kernels: list[dict], info: dict) -> None:
    total = sum(k["ms"] for k in kernels) or 1.0
    by_rule: Counter = Counter()
    for k in kernels:
        by_rule[k["rule"]] += k["ms"]
    row["kernel_sum_ms"] = total
    row["share_per_rule"] = {r: ms / total for r, ms in by_rule.most_common()}
    row["fallback_share"] = by_rule.get("fallback", 0.0) / total + by_rule.get("unscheduled", 0.0) / total
    row["generic_share"] = sum(by_rule.get(r, 0.0) for r in GENERIC_RULES) / total
    times = {k["name"]: k for k in kernels}
    for g in row.get("generic_kernels", []):
        t = times.get(g["name"])
        if t:
            g["ms"] = t["ms"]
            g["ms_per_call"] = t["ms"] / t["calls"]
            g["share"] = t["ms"] / total
    row.get("generic_kernels", []).sort(key=lambda g: -g.get("ms", 0.0))
    row["top_kernels"] = [{"name": k["name"], "rule": k["rule"], "ms": k["ms"], "calls": k["calls"],
                           "share": k["ms"] / total, "ops": info.get(k["name"], {}).get("kind")}
                          for k in kernels[:8]]


def _same_ops_columns(row: dict, rows: list[dict]) -> None:
    from profile_kernels import same_ops_summary

    by_kernel: dict[str, list[dict]] = {}
    for r in rows:
        by_kernel.setdefault(r["kernel"], []).append(r)
    for g in row.get("generic_kernels", []):
        if g["name"] in by_kernel and g.get("ms_per_call") is not None:
            g["vs_ort"] = same_ops_summary(g["ms_per_call"], by_kernel[g["name"]], g["ops"])
    slow = [g for g in row.get("generic_kernels", [])
            if g["rule"] in ("fallback", "unscheduled") and (g.get("vs_ort") or {}).get("ratio")
            and g["vs_ort"]["ratio"] > 2.0]
    row["fallback_over_2x_ort"] = [g["name"] for g in slow]


# ---------------------------------------------------------------------------------------------------------
# Output

def _fmt_s(v) -> str:
    if v is None:
        return "-"
    return v if isinstance(v, str) else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def host_bandwidth_gbps(mb: int = 256, rounds: int = 5) -> float:
    """The host's memory bandwidth as a copy sees it: ``mb`` MB copied in one half per core at once, bytes
    read + written per second (min time over ``rounds``). A roofline for kernels that stream their weights."""
    from concurrent.futures import ThreadPoolExecutor

    src = np.ones(mb * (1 << 20) // 4, dtype=np.float32)
    dst = np.empty_like(src)
    parts = max(1, os.cpu_count() or 1)
    cuts = np.linspace(0, src.size, parts + 1).astype(int)
    best = float("inf")
    with ThreadPoolExecutor(parts) as pool:
        for _ in range(rounds):
            t = time.perf_counter()
            list(pool.map(lambda i: np.copyto(dst[cuts[i]:cuts[i + 1]], src[cuts[i]:cuts[i + 1]]), range(parts)))
            best = min(best, time.perf_counter() - t)
    return 2 * src.nbytes / best / 1e9


def constant_bytes(path) -> int:
    """Bytes of an ONNX model's initializers that one call reads whole (its weights): a table only gathered
    from (a token embedding: one row per token) is left out."""
    import onnx
    from onnx import helper

    model = onnx.load(str(path), load_external_data=False)
    uses: dict[str, set] = {}
    for node in model.graph.node:
        for pos, name in enumerate(node.input):
            uses.setdefault(name, set()).add((node.op_type, pos))
    return sum(int(np.prod(t.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
               for t in model.graph.initializer if uses.get(t.name) != {("Gather", 0)})


def weight_stream_note(row: dict, path, bandwidth_gbps: float | None) -> None:
    """Add the rate at which a call of ours reads the model's weights, and its share of the host's bandwidth
    (a decode step is bound by it: two FLOPs per weight element)."""
    if bandwidth_gbps is None or not row.get("ours_ms"):
        return
    try:
        weights = constant_bytes(path)
    except Exception:  # noqa: BLE001 - a model the onnx package cannot read here: no note
        return
    rate = weights / (row["ours_ms"] * 1e-3) / 1e9
    row["weights_mb"], row["weights_gbps"] = round(weights / 1e6, 1), round(rate, 1)
    row["bandwidth_fraction"] = round(rate / bandwidth_gbps, 3)
    row["notes"].append(f"weights {weights / 1e6:.1f} MB read per call at {rate:.1f} GB/s = "
                        f"{rate / bandwidth_gbps:.0%} of the host's {bandwidth_gbps:.1f} GB/s (copy)")


def table(rows: list[dict]) -> str:
    head = ["model", "builds dflt/ours", "rel err dflt/ours", "kernels dflt/ours", "launches per rule",
            "fallback (n, share)", "generic share", "compile s dflt/ours (x)", "ours/ORT ms"]
    lines = []
    for r in rows:
        b = lambda k: {True: "ok", False: "FAIL", None: "-"}[r.get(f"built_{k}")]  # noqa: E731
        err = lambda k: "-" if r.get(f"rel_err_{k}") is None else f"{r[f'rel_err_{k}']:.0e}"  # noqa: E731
        if r.get("cosine_ours") is not None:      # a quantized model: judged by cosine
            err = lambda k: "-" if r.get(f"cosine_{k}") is None else f"cos {r[f'cosine_{k}']:.4f}"  # noqa: E731
        per_rule = " ".join(f"{k}:{v}" for k, v in (r.get("launches_per_rule") or {}).items())
        fb = [g for g in r.get("generic_kernels", []) if g["rule"] in ("fallback", "unscheduled")]
        fb_launch = sum(g["launches"] for g in fb)
        share = r.get("fallback_share")
        comp = f"{_fmt_s(r.get('compile_s_default'))}/{_fmt_s(r.get('compile_s_ours'))}"
        if r.get("compile_ratio"):
            comp += f" ({r['compile_ratio']:.2f})"
        speed = "-" if r.get("ours_over_ort") is None else \
            f"{r['ours_over_ort']:.2f} ({r['ours_ms']:.2f}/{r['ort_ms']:.2f})"
        lines.append([r["model"], f"{b('default')}/{b('ours')}", f"{err('default')}/{err('ours')}",
                      f"{r.get('kernels_default', '-')}/{r.get('kernels_ours', '-')}", per_rule or "-",
                      f"{fb_launch}, {100 * share:.0f}%" if share is not None else (f"{fb_launch}" if fb else "-"),
                      "-" if r.get("generic_share") is None else f"{100 * r['generic_share']:.0f}%", comp, speed])
    cells = [head] + lines
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    out = [" | ".join(c.ljust(w) for c, w in zip(line, widths)) for line in cells]
    out.insert(1, "-+-".join("-" * w for w in widths))
    notes = []
    for r in rows:
        for k in ("error_default", "error_ours", "error_run_ours", "error_ort"):
            if r.get(k):
                notes.append(f"  {r['model']}: {k[6:]}: {r[k]}")
        for n in r.get("notes", []):
            notes.append(f"  {r['model']}: {n}")
        d = r.get("diagnosis_ours")
        if d:
            notes.append(f"  {r['model']}: ours diagnosis: phases {d.get('phases')}; hung {d.get('hung')}; "
                         f"failed {d.get('failed')}; slowest kernel builds {d.get('slowest_kernels')}")
    return "\n".join(out + (["notes:"] + notes if notes else []))


def generic_table(rows: list[dict]) -> str:
    out = ["generic-rule kernels (fallback/unscheduled, reduction, elementwise): our time per call vs "
           "onnxruntime's node time for the same ONNX ops",
           f"{'model':20} {'rule':11} {'n':>3} {'share':>6} {'ours ms':>8} {'ORT ms':>8} {'x':>6}  ops / shapes"]
    for r in rows:
        for g in r.get("generic_kernels", []):
            v = g.get("vs_ort") or {}
            ort = "-" if v.get("ort_ms_per_call") is None else f"{v['ort_ms_per_call']:.3f}"
            ratio = "-" if v.get("ratio") is None else f"{v['ratio']:.2f}"
            ops = "+".join(o.replace("relax.", "") for o in g["ops"])[:70]
            share = "-" if g.get("share") is None else f"{100 * g['share']:.1f}%"
            ms = "-" if g.get("ms_per_call") is None else f"{g['ms_per_call']:.3f}"
            out.append(f"{r['model'][:20]:20} {g['rule'][:11]:11} {g['launches']:>3} {share:>6} {ms:>8} {ort:>8} "
                       f"{ratio:>6}  {ops} [{g['shapes'][:60]}]")
            if v and v.get("ort_ms_per_call") is None and v.get("why"):
                out.append(f"{'':20} {'':11} {'':>3} {'':>6} {'':>8} unmatched: {v['why']}")
    return "\n".join(out)


def family(g: dict) -> str:
    """A generic kernel's family: its source ops without numbering (consecutive repeats once), a depthwise
    conv (weight ``C x 1 x kh x kw``) or grouped conv (weight channels below the data's) named so."""
    import re

    ops = []
    for o in g["ops"]:
        o = re.sub(r"\d+$", "", o.replace("relax.", ""))
        if not ops or ops[-1] != o:
            ops.append(o)
    shapes = g.get("shapes", "").split()
    if "conv2d" in ops and len(shapes) > 1 and shapes[0].count("x") == 3 and shapes[1].count("x") == 3:
        data, weight = shapes[0].split("x"), shapes[1].split("x")
        if weight[1] == "1" and data[1] != "1":
            ops[ops.index("conv2d")] = f"depthwise_conv2d{weight[2]}x{weight[3]}"
        elif weight[1] != data[1]:
            ops[ops.index("conv2d")] = f"grouped_conv2d{weight[2]}x{weight[3]}"
    return "+".join(ops)


def family_table(rows: list[dict]) -> str:
    fams: dict[str, dict] = {}
    for r in rows:
        for g in r.get("generic_kernels", []):
            f = fams.setdefault(family(g), {"rules": set(), "models": set(), "launches": 0, "ratios": [],
                                            "shares": []})
            f["rules"].add(g["rule"])
            f["models"].add(r["model"])
            f["launches"] += g["launches"]
            if (g.get("vs_ort") or {}).get("ratio"):
                f["ratios"].append(g["vs_ort"]["ratio"])
            if g.get("share") is not None:
                f["shares"].append(g["share"])
    out = ["generic-rule kernel families (ops without numbering): rules, launches over all models, largest share "
           "of one kernel in its model, ours/ORT on the same ops (min-max over matched kernels), models",
           f"{'family':48} {'rules':22} {'n':>4} {'max share':>9} {'ours/ORT':>13}  models"]
    for name, f in sorted(fams.items(), key=lambda kv: -max(kv[1]["shares"] or [0])):
        ratio = "-" if not f["ratios"] else f"{min(f['ratios']):.1f}-{max(f['ratios']):.1f}"
        share = "-" if not f["shares"] else f"{100 * max(f['shares']):.1f}%"
        out.append(f"{name[:48]:48} {','.join(sorted(f['rules']))[:22]:22} {f['launches']:>4} {share:>9} "
                   f"{ratio:>13}  {', '.join(sorted(f['models']))}")
    return "\n".join(out)


def print_tables(rows: list[dict]) -> None:
    print(table(rows))
    print()
    print(generic_table(rows))
    print()
    print(family_table(rows))


def build_parser() -> argparse.ArgumentParser:
    """The command line's options (the harness's tests parse through it too, so their options cannot drift)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="public model names, W1..W7, ONNX files, or all / public / workloads")
    ap.add_argument("--json", help="write all rows to this JSON file (rewritten after each model)")
    ap.add_argument("--cache", default=None, help="folder of exported models (default: public_models' cache)")
    ap.add_argument("--workdir", default=None, help="where the per-model temporary folders go")
    ap.add_argument("--keep", action="store_true", help="keep the per-model folders (libraries, logs)")
    ap.add_argument("--compile-timeout", type=float, default=900.0, help="seconds for our compile")
    ap.add_argument("--default-compile-timeout", type=float, default=900.0, help="seconds for TVM default's")
    ap.add_argument("--compile-rounds", type=int, default=1, help="alternating compiles of each, min kept")
    ap.add_argument("--diagnose", action=argparse.BooleanOptionalAction, default=True,
                    help="when our compile times out, time it phase by phase and kernel by kernel")
    ap.add_argument("--diagnose-step-timeout", type=float, default=240.0)
    ap.add_argument("--rounds", type=int, default=3, help="alternating natural-loop rounds (>= 3)")
    ap.add_argument("--round-ms", type=float, default=50.0, help="length of one round's timed calls")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds for a load, a call or a round")
    ap.add_argument("--default-run-timeout", type=float, default=180.0,
                    help="seconds for TVM default's single agreement call")
    ap.add_argument("--no-default-run", action="store_true", help="skip TVM default's agreement call")
    ap.add_argument("--profile-timeout", type=float, default=900.0)
    ap.add_argument("--same-ops", action=argparse.BooleanOptionalAction, default=True,
                    help="time onnxruntime on the ONNX ops of each generic-rule kernel")
    ap.add_argument("--same-ops-calls", type=int, default=3, help="calls of each kernel matched (first N)")
    ap.add_argument("--tol", type=float, default=1e-3, help="agreement: max|ours - ORT| / max|ORT| below this")
    ap.add_argument("--precision-mode", default=None,
                    help="our build's precision mode (CANN's names, e.g. force_fp16); ORT runs the model as it is")
    ap.add_argument("--fusion-switch", default=None, type=lambda p: str(Path(p).resolve()),
                    help="our build's fusion switch file (CANN's --fusion_switch_file forms, switches.py)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bandwidth", action=argparse.BooleanOptionalAction, default=True,
                    help="measure the host's memory bandwidth (a copy) and note the rate each model reads its "
                         "weights at, as a share of it")
    ap.add_argument("--int-high", type=int, default=None,
                    help="integer inputs in [0, N) for models that do not record their vocabulary (default 2)")
    return ap


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--from-json"] and len(argv) == 2:
        with open(argv[1]) as f:
            print_tables(json.load(f)["rows"])
        return 0
    if argv[:1] == ["--worker"] or "--worker" in argv[:1]:
        return worker_main(argv)
    ap = build_parser()
    opts = ap.parse_args(argv)
    if opts.rounds < 1:
        ap.error("--rounds must be at least 1")
    names = expand(opts.models)
    cache = Path(opts.cache) if opts.cache else None
    meta = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "target": TARGET, "ort_threads": ORT_THREADS,
            "env": {k: os.environ.get(k) for k in ("TVM_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT")},
            "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_start": os.getloadavg(),
            "argv": argv}
    try:
        import onnxruntime
        import tvm

        meta.update(tvm=tvm.__version__, onnxruntime=onnxruntime.__version__)
    except ImportError:
        pass
    try:
        from tqdm import tqdm

        progress = tqdm(names, desc="models", unit="model", file=sys.stderr)
    except ImportError:
        progress = names
    # measured once, before any model: the roofline of the weight-streaming note (decode steps)
    opts.bandwidth_gbps = round(host_bandwidth_gbps(), 1) if opts.bandwidth else None
    meta["host_bandwidth_gbps"] = opts.bandwidth_gbps
    rows = []
    for name in progress:
        if hasattr(progress, "set_postfix_str"):
            progress.set_postfix_str(name)
        t = time.perf_counter()
        try:
            row = benchmark_model(name, opts, cache)
        except SystemExit as err:
            row = {"model": name, "notes": [str(err)], "error_ours": str(err)}
        except Exception as err:  # noqa: BLE001 - one model's harness failure must not lose the others
            row = {"model": name, "notes": [f"harness error: {one_line(err)}"], "trace": traceback.format_exc()}
        row["bench_wall_s"] = round(time.perf_counter() - t, 1)
        for k in ("lib_default", "lib_ours"):
            row.pop(k, None)
        rows.append(row)
        log(table([row]))
        if opts.json:
            meta["end"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            meta["loadavg_end"] = os.getloadavg()
            with open(opts.json, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
                f.write("\n")
    print_tables(rows)
    print("\nCPU wall-clock on the host, not NPU times; ours/ORT = ratio of minima over alternating rounds of the "
          "natural loop, each runtime in its own process (noisy on a shared machine: see loadavg in the JSON).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
