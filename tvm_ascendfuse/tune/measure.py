"""Building and timing candidates: MetaSchedule's builder and runners, on this machine or through TVM's RPC
tracker.

Builds are always local, in worker processes kept across calls (``CandidateBuilds``, one per core). Runs go to
MetaSchedule's ``LocalRunner``,
or with an ``RPCSpec`` to its ``RPCRunner``: every measurement asks the tracker for a free server under the
key, so as many candidates run at once as servers are registered. A server that dies mid-run costs only the
candidate it was running (MetaSchedule reports it as a failed run); the tracker drops the server and the
next requests go to the others.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import tvm
from tvm import tirx

from ..errors import AscendFuseError


@dataclass(frozen=True)
class RPCSpec:
    """Where to measure: a tracker and the key its servers registered under."""

    host: str
    port: int
    key: str
    session_timeout: int = 120   # seconds one measurement session may take before the server ends it

    def __str__(self) -> str:
        return f"{self.key}@{self.host}:{self.port}"


def parse_address(text: str, what: str = "--rpc-tracker") -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port), or an error naming the expected form."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise AscendFuseError(f"{what} must be HOST:PORT with a port in 1-65535, got '{text}'")
    return host.strip("[]"), int(port)


def rpc_config(spec: RPCSpec):
    from tvm.s_tir import meta_schedule as ms

    return ms.runner.RPCConfig(tracker_host=spec.host, tracker_port=spec.port, tracker_key=spec.key,
                               session_timeout_sec=spec.session_timeout)


def count_servers(spec: RPCSpec) -> int:
    """Servers registered under the key; an error that says what to start when none is, or the tracker is
    not there."""
    import socket

    try:
        # first a plain connection: TVM's own client retries an unreachable tracker for a minute
        socket.create_connection((spec.host, spec.port), timeout=10).close()
        n = rpc_config(spec).count_num_servers(allow_missing=True)
    except (ValueError, OSError, RuntimeError) as err:
        raise AscendFuseError(f"cannot reach the RPC tracker at {spec.host}:{spec.port} ({last_line(err)}); "
                              "start one with: ascendfuse rpc tracker --port PORT") from None
    if n == 0:
        raise AscendFuseError(f"no RPC server is registered under key '{spec.key}' at the tracker "
                              f"{spec.host}:{spec.port}; start one with: ascendfuse rpc server --tracker "
                              f"{spec.host}:{spec.port} --key {spec.key}")
    return n


def last_line(error) -> str:
    """The last non-empty line of an error's text (TVM errors end with the check that failed), at most 200
    characters, for a report."""
    lines = [line for line in str(error or "").strip().splitlines() if line.strip()]
    if lines:
        return lines[-1].strip()[:200]
    return type(error).__name__ if isinstance(error, BaseException) else "unknown error"


class Measure:
    """Build candidates in ``CandidateBuilds`` and time them with MetaSchedule's runner (local or RPC).

    ``__call__(mods_args, rounds, serial)`` -> ``(fastest seconds or None, error)`` per (module, args_info):
    ``rounds`` interleaved runs of all of them. ``serial=True`` runs one candidate at a time (the side-by-side
    check: with several RPC servers, parallel runs would time the candidates on different boards at once)."""

    def __init__(self, host, rpc: RPCSpec | None = None, repeats: int = 5, cores: int | None = None):
        from tvm.s_tir import meta_schedule as ms

        self.host, self.rpc = host, rpc
        self.cores = max(1, cores or os.cpu_count() or 1)
        self.evaluator = ms.runner.EvaluatorConfig(number=1, repeat=repeats, min_repeat_ms=20,
                                                   enable_cpu_cache_flush=False)
        self.builder = CandidateBuilds(self.cores)
        self.workers = count_servers(rpc) if rpc is not None else 1
        self.runner = self._runner(self.workers)
        self._serial = self.runner if self.workers == 1 else None

    def _runner(self, workers: int):
        from tvm.s_tir import meta_schedule as ms

        if self.rpc is None:
            return ms.runner.LocalRunner(evaluator_config=self.evaluator)
        return ms.runner.RPCRunner(rpc_config(self.rpc), self.evaluator, max_workers=workers)

    def __call__(self, mods_args, rounds: int = 1, serial: bool = False) -> list[tuple[float | None, str | None]]:
        from tvm.s_tir import meta_schedule as ms

        if serial and self._serial is None:
            self._serial = self._runner(1)
        runner = self._serial if serial else self.runner
        built = self.builder.build([mod for mod, _ in mods_args], self.host)
        errors = [err for _, err in built]
        best: list[float | None] = [None] * len(built)
        todo = [(j, ms.runner.RunnerInput(path, "cpu", args))
                for j, ((path, err), (_, args)) in enumerate(zip(built, mods_args)) if err is None]
        try:
            for _ in range(rounds):
                for (j, _), future in zip(todo, runner.run([inp for _, inp in todo])):
                    r = future.result()
                    if r.error_msg is not None:
                        errors[j] = r.error_msg
                        continue
                    # the fastest repeat: on a shared machine the mean mostly measures the neighbours
                    fastest = min(float(x) for x in r.run_secs)
                    best[j] = fastest if best[j] is None else min(best[j], fastest)
        finally:
            for path, _ in built:
                if path:
                    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        # a candidate that failed in any round counts as failed: its other rounds may be the lucky ones
        return [(None if err is not None else t, err) for t, err in zip(best, errors)]

    def close(self) -> None:
        """Stop the builder's and runners' worker processes (they would otherwise live until collected)."""
        self.builder.close()
        for obj in {id(o): o for o in (self.runner, self._serial) if o is not None}.values():
            pool = getattr(obj, "pool", None)
            if pool is not None:
                pool.shutdown(wait=False)


class CandidateBuilds:
    """Candidates built (``build_candidate``) and exported (``export_candidate``) in ``workers`` processes that
    live across calls. MetaSchedule's ``LocalBuilder`` starts a fresh pool for every call, against a memory
    leak of long-lived workers, and each of its workers imports TVM and this package before it builds: about
    9 s on a 2-core Zen 3 for every batch, several times a tuned kernel's builds. Here a worker is replaced
    after ``RECYCLE_AFTER`` builds (bounding that leak), after a timeout and after a crash (an LLVM abort
    costs only its candidate)."""

    RECYCLE_AFTER = 64
    TIMEOUT_SEC = 300

    def __init__(self, workers: int):
        from tvm.support.popen_pool import PopenPoolExecutor

        self.pool = PopenPoolExecutor(max_workers=workers, timeout=self.TIMEOUT_SEC,
                                      maximum_process_uses=self.RECYCLE_AFTER)

    def build(self, mods, target) -> list[tuple[str | None, str | None]]:
        """``(artifact path, None)`` or ``(None, error)`` per module, in order."""
        from tvm.support.popen_pool import StatusKind

        out = []
        for r in self.pool.map_with_error_catching(lambda mod: _build_in_worker(mod, target), list(mods)):
            if r.status == StatusKind.COMPLETE:
                out.append((r.value, None))
            elif r.status == StatusKind.TIMEOUT:
                out.append((None, f"build timed out after {self.TIMEOUT_SEC} s"))
            else:
                out.append((None, f"build failed: {r.value}"))
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False)


def _build_in_worker(mod: tvm.IRModule, target) -> str:
    return export_candidate(build_candidate(mod, target))


def build_candidate(mod: tvm.IRModule, target):
    """Build one measured candidate in a builder worker.

    As MetaSchedule's default build (the weight-packing block removed: the kernel is timed on the packed
    weight, which the pipeline packs once at compile time), but with the rewrites no trace records made as
    an applied record gets them (``schedule.tuned.finish_traced``), the kernel named first (a workload carries
    no ``global_symbol``: the database key omits names, and TVM only exports a named PrimFunc) and without
    importing ``tvm.s_tir.tensor_intrin``, which takes about a minute and only serves tensorized schedules."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from ..schedule.transpose import rewrite_transposed_stages

    funcs = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            func = rewrite_transposed_stages(func)[0]     # what ``tuned.finish_traced`` makes of a record
            if func.attrs is None or "global_symbol" not in func.attrs:
                func = func.with_attr("global_symbol", gv.name_hint)
        funcs[gv] = func
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(tvm.IRModule(funcs))
    return tvm.tirx.build(mod, target=target)


def export_candidate(rt_mod) -> str:
    """A built candidate as a linked shared library (MetaSchedule's default exports object files in a tar,
    which every RPC server then links itself, once per candidate, on the measuring machine)."""
    import tempfile

    path = os.path.join(tempfile.mkdtemp(prefix="ascendfuse-candidate-"), "candidate.so")
    rt_mod.export_library(path)
    return path


def args_of(mod: tvm.IRModule):
    """The arguments a runner allocates for a scheduled kernel (packed weights as the kernel reads them)."""
    from tvm.s_tir import meta_schedule as ms

    return ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)
