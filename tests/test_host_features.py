"""The host target carries the vector extensions the CPU reports, where LLVM's name for the CPU disagrees (a
virtual machine presenting a Xeon with AVX512-BF16 under Rocket Lake's model number; a hypervisor masking
AVX-512)."""

from __future__ import annotations

import tvm

from tvm_ascendfuse import get_target
from tvm_ascendfuse.host_features import host_mattr, reconcile, reported_flags
from tvm_ascendfuse.schedule.common import has_feature, vector_bits
from tvm_ascendfuse.schedule.hostvec import has_bf16_dot

AVX512_BASE = ("sse2 avx avx2 fma f16c avx512f avx512dq avx512cd avx512bw avx512vl avx512ifma avx512vbmi "
               "avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq")


def _cpuinfo(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu {flags}\n\n"
                    f"processor\t: 1\nflags\t\t: fpu {flags}\n")
    return path


def test_flags_are_read_from_the_first_processor(tmp_path):
    assert reported_flags(_cpuinfo(tmp_path, "avx2 avx512_bf16")) == {"fpu", "avx2", "avx512_bf16"}
    assert reported_flags(tmp_path / "missing") is None


def test_extensions_the_cpu_name_lacks_are_added(tmp_path):
    """Rocket Lake's table has no BF16, FP16 or AVX-VNNI; a CPU that reports them gets them, and the bf16 dot
    rule's feature test then says yes."""
    path = _cpuinfo(tmp_path, AVX512_BASE + " avx512_bf16 avx512_fp16 avx_vnni amx_tile amx_bf16")
    mattr = host_mattr("rocketlake", path)
    assert sorted(mattr) == ["+avx512bf16", "+avx512fp16", "+avxvnni"]     # AMX is not taken
    host = tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake", "mattr": mattr})
    assert has_bf16_dot(host)
    assert not has_bf16_dot(tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake"}))


def test_extensions_the_cpu_does_not_report_are_removed(tmp_path):
    """A hypervisor masking AVX-512 under a Skylake-server model: the kernels must be AVX2 code."""
    path = _cpuinfo(tmp_path, "sse2 avx avx2 fma f16c")
    mattr = host_mattr("skylake-avx512", path)
    assert "-avx512f" in mattr and not any(m.startswith("+") for m in mattr)
    host = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "mattr": mattr})
    assert not has_feature("avx512f", host) and vector_bits(host) == 256


def test_agreeing_or_unknown_listings_change_nothing(tmp_path):
    assert host_mattr("icelake-server", _cpuinfo(tmp_path, AVX512_BASE + " gfni")) == []
    assert reconcile({"avx512f"}, None) == []
    assert reconcile({"avx512f"}, {"fp", "asimd"}) == []            # an Arm listing: not ours to judge


def test_the_host_target_matches_this_machine():
    host = get_target("ascend910b").host_target()
    flags = reported_flags() or set()
    if "avx512_bf16" in flags:
        assert has_bf16_dot(host)
    if flags & {"avx", "sse2"} and "avx512f" not in flags:
        assert vector_bits(host) < 512
