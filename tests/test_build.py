"""The threaded TIR build: same numbers as one module, all kernels linked, exportable."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import tirx
from tvm.script import ir as I
from tvm.script import tirx as T

import tvm_ascendfuse as af
from tvm_ascendfuse.build import split_module
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.workloads import bert_layer

from .helpers import random_inputs, run_reference, run_vm, tol
from tests.helpers import assert_close


def _bert():
    return import_onnx(bert_layer(seq=16, hidden=64, heads=4, ffn=128))


def test_two_jobs_same_numbers_as_one_and_export(tmp_path):
    mod = _bert()
    x = random_inputs(mod)
    one = af.compile_model(mod, portable=True, jobs=1)
    two = af.compile_model(mod, portable=True, jobs=2)
    kernels = [gv for gv, f in two.scheduled_module.functions.items() if isinstance(f, tirx.PrimFunc)]
    assert len(kernels) >= 2          # really split: every kernel must be found across the linked modules
    got = run_vm(two.executable, x)
    np.testing.assert_array_equal(got, run_vm(one.executable, x))
    assert_close(got, run_reference(mod, x), **tol("float32"))
    path = str(tmp_path / "bert.so")
    two.executable.export_library(path)
    np.testing.assert_array_equal(run_vm(tvm.runtime.load_module(path), x), got)


def test_split_balances_and_keeps_every_function():
    mod = af.compile_model(_bert(), portable=True).scheduled_module
    tir_mod = tvm.IRModule({gv: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)})
    parts = split_module(tir_mod, 2)
    assert len(parts) == 2
    assert all(len(unit.get_global_vars()) == 1 for p in parts for unit in p)   # one module per kernel
    names = sorted(gv.name_hint for p in parts for unit in p for gv in unit.get_global_vars())
    assert names == sorted(gv.name_hint for gv in tir_mod.get_global_vars())
    [one] = split_module(tir_mod, 1)
    assert len(one) == len(names)


def test_every_kernel_build_is_timed_in_the_report():
    result = af.compile_model(_bert(), portable=True, jobs=2)
    build = result.report.sections["build"]
    kernels = {k["name"] for k in result.report.kernels}
    assert set(build["kernel_seconds"]) == kernels
    assert all(s >= 0 for s in build["kernel_seconds"].values())
    slowest = build["slowest_kernels"]
    assert slowest and slowest[0]["seconds"] == max(build["kernel_seconds"].values())
    assert all(k.get("build_seconds") is not None for k in result.report.kernels)


@I.ir_module
class _Calls:
    @T.prim_func(private=True)
    def add_one(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in range(4):
            b[i] = a[i] + T.float32(1)

    @T.prim_func(private=True)
    def twice(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in range(4):
            b[i] = a[i] * T.float32(2)

    @T.prim_func
    def caller(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        _Calls.add_one(a.data, b.data)


def test_functions_calling_each_other_stay_in_one_module():
    independent = tvm.IRModule({gv: f for gv, f in _Calls.functions.items() if gv.name_hint != "caller"})
    assert len(split_module(independent, 2)) == 2
    assert split_module(_Calls, 2) == [[_Calls]]


def test_default_jobs_leaves_busy_cores_out(monkeypatch):
    import tvm_ascendfuse.build as build

    host = af.get_target("ascend910b").host_target(portable=True, num_cores=4)
    monkeypatch.setattr(build.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(build, "_others_running", lambda: 0)
    assert build.default_jobs(host) == 4            # the target's cores, not the machine's
    monkeypatch.setattr(build, "_others_running", lambda: 3)
    assert build.default_jobs(host) == 1
    monkeypatch.setattr(build, "_others_running", lambda: 9)
    assert build.default_jobs(host) == 1
    monkeypatch.setattr(build, "_others_running", lambda: None)
    assert build.default_jobs(host) == 4


def test_without_relax_builds_private_steps_tvm_compile_builds_it(monkeypatch):
    """A TVM whose vm_build lacks the steps build() splits falls back to tvm.compile (same numbers)."""
    import tvm_ascendfuse.build as build

    assert build.split_build_available()
    monkeypatch.setattr(build, "split_build_available", lambda: False)
    called, real = [], build.tvm.compile
    monkeypatch.setattr(build.tvm, "compile", lambda *a, **k: called.append(1) or real(*a, **k))
    mod = _bert()
    x = random_inputs(mod)
    result = af.compile_model(mod, portable=True)
    assert called
    assert_close(run_vm(result.executable, x), run_reference(mod, x), **tol("float32"))
