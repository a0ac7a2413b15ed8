"""Relax build with the kernels' TIR lowering and LLVM code generation spread over the host's cores.

``tvm.compile`` lowers and code-generates every PrimFunc of a model in one LLVM module on one thread; for
our fused kernels that is more than half of a compile (of a decoder block). ``build`` does what
``relax.build`` does (Relax pipeline, VM codegen, TIR build, VM link) but builds every PrimFunc as a module
of its own, spread over ``jobs`` threads (largest kernels first; the lowering and LLVM run in C++ without
the GIL), and links the resulting LLVM modules into one VM executable. Splitting changes no generated code,
only the wall-clock time of the TIR build (close to halved with two idle cores); one module per kernel
measured no slower to build, link, load or run than one per thread, and it times every kernel's build
(``timings``: the report's ``build`` section names the slowest kernels, so a kernel that makes LLVM slow is
found at once). PrimFuncs that call each other must stay in one module: then the module is built whole.
By default only idle cores are used (``default_jobs``). The TIR build skips TIR's CSE (``TIR_CONFIG``: LLVM
does the same).
"""

from __future__ import annotations

import os
import threading
import time

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax import vm_build

from .progress import bar


def default_jobs(host) -> int:
    """Threads for the TIR build: the host target's cores (at most the machine's) that nothing else is
    running on right now. With every core busy, two threads measured slower than one (while another process
    used one of the two cores), so busy cores are left out."""
    cores = os.cpu_count() or 1
    if host is not None and "num-cores" in host.attrs:
        cores = min(cores, max(1, int(host.attrs["num-cores"])))
    busy = _others_running()
    return max(1, cores - busy) if busy is not None else max(1, cores)


def _others_running() -> int | None:
    """Runnable threads besides this one (``/proc/loadavg``: instantaneous count, least of three reads);
    None where that file does not exist."""
    try:
        counts = []
        for _ in range(3):
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]))
    except (OSError, ValueError, IndexError):
        return None
    return max(0, min(counts) - 1)


# relax.build's steps used here are private to tvm.relax.vm_build (TVM 0.27); without them, tvm.compile.
_VM_BUILD_STEPS = ("_vmcodegen", "_filter_tir", "_auto_attach_system_lib_prefix", "_is_device_module", "_ffi_api")


def split_build_available() -> bool:
    return all(hasattr(vm_build, n) for n in _VM_BUILD_STEPS) and hasattr(vm_build._ffi_api, "VMLink")


def build(mod: tvm.IRModule, target, relax_pipeline, jobs: int | None = None, timings: dict | None = None):
    """``relax.build(mod, target, relax_pipeline=relax_pipeline)`` with the TIR build on ``jobs`` threads.
    ``timings``, when given, receives ``{"tir_build_seconds", "jobs", "kernels": {name: seconds}}``."""
    if not split_build_available():
        with _build_context():
            return tvm.compile(mod, target=target, relax_pipeline=relax_pipeline)
    with target:
        mod = relax_pipeline(mod)
    attrs = dict(mod.attrs) if mod.attrs else {}
    ext_libs = list(attrs.get("external_mods", []))
    params = dict(attrs.get("const_name_to_constant", {}))
    builder = relax.ExecBuilder()
    mod = vm_build._vmcodegen(builder, mod, "bytecode")
    tir_mod = vm_build._filter_tir(mod)
    libs = []
    if tir_mod is not None and len(tir_mod.get_global_vars()) > 0:
        tir_mod = vm_build._auto_attach_system_lib_prefix(tir_mod, target, None)
        jobs = jobs if jobs is not None else default_jobs(target)
        t0 = time.perf_counter()
        libs = build_tir(tir_mod, target, jobs, seconds := {})
        if timings is not None:
            timings.update(tir_build_seconds=round(time.perf_counter() - t0, 3), jobs=jobs, kernels=seconds)
    device = [m for m in ext_libs if vm_build._is_device_module(m)]
    host_ext = [m for m in ext_libs if not vm_build._is_device_module(m)]
    lib = libs[0] if libs else None
    if lib is not None:
        for m in device:
            lib.import_module(m)
    # the other kernel modules are linked like external libraries: the VM finds a kernel in any import
    exe = vm_build._ffi_api.VMLink(builder, target, lib, libs[1:] + host_ext, params)
    return vm_build.VMExecutable(exe)


# TIR's CommonSubexprElim repeats what LLVM's EarlyCSE/GVN do on the same code: off, the workloads' kernels
# ran at the same single-thread speed and lowered faster.
TIR_CONFIG = {"tirx.disable_cse_tir": True}


def _build_context() -> tvm.transform.PassContext:
    """The caller's PassContext with ``TIR_CONFIG`` added (settings the caller made win)."""
    ctx = tvm.transform.PassContext.current()
    config = {**TIR_CONFIG, **dict(ctx.config)}
    return tvm.transform.PassContext(opt_level=ctx.opt_level, required_pass=list(ctx.required_pass),
                                     disabled_pass=list(ctx.disabled_pass), instruments=list(ctx.instruments),
                                     config=config)


def build_tir(tir_mod: tvm.IRModule, target, jobs: int, seconds: dict | None = None) -> list:
    """Runtime modules for ``tir_mod``: one per kernel (one for the whole module when its functions call each
    other), built on up to ``jobs`` threads. ``seconds`` receives each module's build time by kernel name."""
    parts = split_module(tir_mod, jobs)
    ctx = _build_context()
    seconds = seconds if seconds is not None else {}
    libs = [[] for _ in parts]
    errors = []
    shown = bar(total=sum(len(p) for p in parts), desc="code generation", unit="kernel", delay=2.0)

    def run(i):
        try:
            with ctx:
                for unit in parts[i]:
                    t0 = time.perf_counter()
                    libs[i].append(tvm.tirx.build(unit, target=target, pipeline="default"))
                    name = "+".join(gv.name_hint for gv in unit.get_global_vars())
                    seconds[name] = round(time.perf_counter() - t0, 3)
                    shown.update()
        except BaseException as err:  # noqa: BLE001 - re-raised on the calling thread
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,), name=f"ascendfuse-tir-{i}") for i in range(1, len(parts))]
    for t in threads:
        t.start()
    run(0)
    for t in threads:
        t.join()
    shown.close()
    if errors:
        raise errors[0]
    return [lib for part in libs for lib in part]


def split_module(tir_mod: tvm.IRModule, jobs: int) -> list[list[tvm.IRModule]]:
    """The modules each of up to ``jobs`` threads builds: one module per kernel, the kernels spread so that
    each thread gets about the same total size (``_size``, largest kernel first); one thread building the
    whole module when its functions call each other."""
    funcs = list(tir_mod.functions.items())
    if any(_calls_other_function(f) for _, f in funcs):
        return [[tir_mod]]
    sized = sorted(((_size(f), gv, f) for gv, f in funcs), key=lambda x: -x[0])
    groups = [[] for _ in range(max(1, min(jobs, len(funcs))))]
    loads = [0] * len(groups)
    for size, gv, f in sized:
        k = loads.index(min(loads))
        groups[k].append(tvm.IRModule({gv: f}, attrs=tir_mod.attrs))
        loads[k] += size
    return [g for g in groups if g]


def _size(func) -> int:
    """Loops + stores: tracks the build time of our kernels (a fixed cost plus a cost per loop; counting
    unrolled iterations overrated the SwiGLU FFN against attention and unbalanced a decoder block's split)."""
    count = [1]

    def one(_):
        count[0] += 1

    tvm_ffi.structural_walk(func, [(tirx.BufferStore, one), (tirx.For, one)])
    return count[0]


def _calls_other_function(func) -> bool:
    found = []
    tvm_ffi.structural_walk(func, (tvm.ir.GlobalVar, found.append))
    return bool(found)
