"""The vector extensions the host CPU reports, where LLVM's name for the CPU says otherwise.

LLVM names the host CPU from its family and model numbers (``llvm_get_system_cpu``), and a target built with
that ``mcpu`` gets the features LLVM's table lists for it. A virtual machine can report model numbers of one
CPU and the features of another: a Xeon with AVX512-BF16, AVX512-FP16 and AVX-VNNI presented as model 167 is
named ``rocketlake``, whose table has none of them, so the bf16 GEMM rule (``vdpbf16ps``) was never chosen
there. The other way round, a hypervisor that masks AVX-512 under a model name that has it would get code the
CPU cannot run.

``host_mattr(mcpu)`` reconciles the two for the extensions the schedules and LLVM's vectorizer use: a feature
the kernel lists in ``/proc/cpuinfo`` (CPU and operating system both enable it) but the ``mcpu`` lacks is
added (``+name``), one the ``mcpu`` claims but the kernel does not list is removed (``-name``). Elsewhere than
Linux nothing is changed. AMX is left out on purpose: its tiles need a per-process permission request that
generated code does not make.
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")

# Linux's flag name -> LLVM's feature name, for the x86 vector extensions.
X86_VECTOR_FLAGS = {
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512f",
    "avx512dq": "avx512dq",
    "avx512cd": "avx512cd",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi",
    "avx512_vbmi2": "avx512vbmi2",
    "avx512_vnni": "avx512vnni",
    "avx512_bitalg": "avx512bitalg",
    "avx512_vpopcntdq": "avx512vpopcntdq",
    "avx512_bf16": "avx512bf16",
    "avx512_fp16": "avx512fp16",
    "avx_vnni": "avxvnni",
}


def reported_flags(cpuinfo: Path = CPUINFO) -> set[str] | None:
    """The CPU flags the kernel reports (the first processor's ``flags`` line), None where there is none."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return None


def reconcile(mcpu_features: set[str], flags: set[str] | None) -> list[str]:
    """``+feature`` / ``-feature`` entries that make a target of the given ``mcpu`` features match ``flags``,
    for the vector extensions in ``X86_VECTOR_FLAGS`` (empty when no flags are known)."""
    if not flags:
        return []
    # a kernel that reports none of the base extensions is not an x86 listing: leave the target alone
    if not flags & {"sse2", "avx"}:
        return []
    out = []
    for flag, feature in X86_VECTOR_FLAGS.items():
        have, claimed = flag in flags, feature in mcpu_features
        if have and not claimed:
            out.append("+" + feature)
        elif claimed and not have:
            out.append("-" + feature)
    return out


def host_mattr(mcpu: str, cpuinfo: Path = CPUINFO) -> list[str]:
    """The ``mattr`` entries a host target named ``mcpu`` needs to match what this machine's CPU reports."""
    import tvm

    try:
        target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
        features = set(tvm.target.codegen.llvm_get_cpu_features(target))
    except Exception:  # an llvm without the query: keep LLVM's own view
        return []
    return reconcile(features, reported_flags(cpuinfo))
