"""Vector facts of the llvm host that size the register tiles of the compute-bound rules.

A GEMM/conv micro-kernel keeps its accumulator tile in vector registers: lanes and register count come
from the host's CPU features (AVX-512: 16 fp32 lanes, 32 registers), not from constants.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import tvm

from .common import has_feature, host_of, num_cores, vector_bits

@dataclass(frozen=True)
class HostVector:
    bits: int          # width of one vector register
    registers: int     # architectural vector registers
    cores: int         # threads the kernel is parallelised over

    def lanes(self, dtype: str) -> int:
        return max(1, self.bits // max(8, tvm.DataType(dtype).bits))

    @property
    def accumulators(self) -> int:
        """Vector registers a micro-kernel may hold accumulators in: half the file, the rest feeds the FMAs
        (AVX-512: 16; more spills: measured much slower)."""
        return max(4, self.registers // 2)

def host_vector(host) -> HostVector:
    host = host_of(host)
    cores = num_cores(host)
    if host is None or host.kind.name != "llvm":
        return HostVector(128, 16, cores)
    bits = vector_bits(host)
    if bits == 512:
        return HostVector(512, 32, cores)
    if bits == 256:
        return HostVector(256, 16, cores)
    if has_feature("neon", host) or "aarch64" in str(host.attrs.get("mtriple", "")):
        return HostVector(128, 32, cores)
    return HostVector(128, 16, cores)

def has_int8_dot(host) -> bool:
    """The host has AVX-512 VNNI's ``vpdpbusd`` (u8 x s8 products summed in fours into int32 lanes)."""
    host = host_of(host)
    return host is not None and host.kind.name == "llvm" and has_feature("avx512vnni", host)

def has_bf16_dot(host) -> bool:
    """The host has AVX512-BF16's ``vdpbf16ps`` (bf16 pairs summed into float32 lanes)."""
    host = host_of(host)
    return host is not None and host.kind.name == "llvm" and has_feature("avx512bf16", host)


# CPUs (LLVM names, by prefix) whose bf16 dot product outruns their float32 FMAs enough to pay for the
# conversions of the bf16 GEMM rule: AMD's Zen 4 and Zen 5 ran force_bf16 BERT / LLaMA blocks at 0.65 / 0.80
# of the float32 build's time. A 2-core Intel Xeon with AVX512-BF16 (Sapphire Rapids class) ran them 1.35-1.46x
# slower than the float32 build (W3 9.43 vs 6.57 ms, W7 33.4 vs 23.8, own processes): its dot product does
# not multiply faster than its two FMA ports. ``ASCENDFUSE_BF16_DOT=on`` / ``off`` overrides.
BF16_DOT_PAYS = ("znver",)
BF16_DOT_ENV = "ASCENDFUSE_BF16_DOT"


def bf16_dot_pays(host) -> bool:
    """The bf16 GEMM rule's dot product is the faster choice on this host: the instruction, on a CPU of
    ``BF16_DOT_PAYS`` (or forced on with ``ASCENDFUSE_BF16_DOT``)."""
    if not has_bf16_dot(host):
        return False
    forced = os.environ.get(BF16_DOT_ENV, "").strip().lower()
    if forced in ("on", "1", "true"):
        return True
    if forced in ("off", "0", "false"):
        return False
    mcpu = str(host_of(host).attrs.get("mcpu", "") or "")
    return mcpu.startswith(BF16_DOT_PAYS)
