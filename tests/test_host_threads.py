"""The runtime's threads are the host's cores: TVM's own default halves the logical CPUs on x86 (assuming
SMT), which on a machine without SMT left half the cores idle."""

from __future__ import annotations

import os
import subprocess
import sys

from tvm_ascendfuse.host_threads import physical_cores, use_physical_cores


def _sysfs(tmp_path, siblings: dict):
    for cpu, text in siblings.items():
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(text + "\n")
    return tmp_path


def test_smt_siblings_count_once(tmp_path):
    sysfs = _sysfs(tmp_path, {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"})
    assert physical_cores([0, 1, 2, 3], sysfs) == 2
    assert physical_cores([0, 2], sysfs) == 1          # both threads of one core allowed: one core


def test_without_smt_every_cpu_is_a_core(tmp_path):
    sysfs = _sysfs(tmp_path, {0: "0", 1: "1"})
    assert physical_cores([0, 1], sysfs) == 2


def test_a_thread_count_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    use_physical_cores()
    assert os.environ["TVM_NUM_THREADS"] == "1"
    monkeypatch.delenv("TVM_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    use_physical_cores()
    assert "TVM_NUM_THREADS" not in os.environ


def test_importing_the_package_gives_the_runtime_the_host_cores():
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    code = ("import tvm_ascendfuse, tvm; from tvm_ascendfuse.host_threads import physical_cores; "
            "print(tvm.runtime.num_threads(), physical_cores())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    threads, cores = map(int, out.stdout.split())
    assert threads == cores
