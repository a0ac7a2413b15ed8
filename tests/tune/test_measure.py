"""Candidate builds: worker processes kept across calls, a failed build reported per candidate."""

import os

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from tvm_ascendfuse.target import get_target
from tvm_ascendfuse.tune.measure import CandidateBuilds

pytest.importorskip("cloudpickle")

HOST = get_target("ascend910b").host_target(portable=True)


@T.prim_func(s_tir=True)
def _double(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
    for i in range(64):
        with T.sblock("b"):
            vi = T.axis.spatial(64, i)
            b[vi] = a[vi] * T.float32(2)


def _worker_pids(builds):
    return sorted(w._proc.pid for w in builds.pool._worker_map.values() if w._proc is not None)


def _run(path):
    f = tvm.runtime.load_module(path)["main"]
    a = tvm.runtime.tensor(np.arange(64, dtype="float32"))
    b = tvm.runtime.tensor(np.zeros(64, dtype="float32"))
    f(a, b)
    return b.numpy()


def test_builds_reuse_their_workers_and_a_failed_build_costs_only_its_candidate():
    mod = tvm.IRModule({"main": _double})
    builds = CandidateBuilds(1)
    try:
        ((path, err),) = builds.build([mod], HOST)
        assert err is None and os.path.isfile(path)
        np.testing.assert_array_equal(_run(path), np.arange(64, dtype="float32") * 2)
        first = _worker_pids(builds)
        assert len(first) == 1

        # a candidate whose build raises (here: no module at all): the call reports it and goes on
        (bad, good) = builds.build([None, mod], HOST)
        assert bad[0] is None and "build failed" in bad[1]
        assert good[1] is None and os.path.isfile(good[0])
        # the same process built every candidate: no worker started again per call
        assert _worker_pids(builds) == first
    finally:
        builds.close()
