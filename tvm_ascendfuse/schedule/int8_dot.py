"""The host's int8 dot product as a TIR tensor intrinsic and the register tile around it, shared by the int8
rules (GEMM and conv).

``C[16] (int32) += sum_k A[k] (uint8) * B[i, k] (int8)`` over 4 k: one AVX-512 VNNI ``vpdpbusd``, the 4
bytes of A broadcast to every lane. TVM ships this intrinsic (``tensor_intrin.x86.dot_16x4_vnni``) with
the LLVM < 20 signature of ``llvm.x86.avx512.vpdpbusd.512`` (int32x16 operands); LLVM 20 changed the byte
operands to ``<64 x i8>``, which the shipped one fails LLVM's verifier with. This one matches the LLVM TVM
was built with.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T

from .common import register_intrin_once

DOT_16x4_U8S8 = "ascendfuse_dot_16x4_u8s8_vnni"
LANES = 16          # int32 lanes of one 512-bit accumulator
DEPTH = 4           # bytes one lane sums per dot-product step
MAX_ROWS = 6        # register tile rows (x vectors: within the accumulator registers)


def register_tile(rows: int, n_vectors: int, accumulators: int) -> tuple[int, int] | None:
    """(rows, vectors) of an int8 register tile: the most accumulators within the budget, with rows dividing
    ``rows`` and vectors dividing ``n_vectors`` (no partial tiles: the intrinsic takes whole vectors)."""
    best = None
    for nv in (4, 3, 2, 1):
        if n_vectors % nv:
            continue
        for mr in range(min(MAX_ROWS, accumulators // nv), 0, -1):
            if rows % mr == 0:
                if best is None or mr * nv > best[0] * best[1]:
                    best = (mr, nv)
                break
    return best


def _byte_operands() -> bool:
    """Whether this LLVM's vpdpbusd takes its byte operands as <64 x i8> (LLVM 20 and later)."""
    try:
        return int(tvm.target.codegen.llvm_version_major()) >= 20
    except Exception:   # noqa: BLE001 - no LLVM in this TVM: nothing will be compiled for x86 anyway
        return True


def dot_16x4_u8s8() -> str:
    """The intrinsic's name, registered in this process on first use (its TVMScript took about a second of
    every import of the package, the CLI's and each tuning worker's included)."""
    return register_intrin_once(DOT_16x4_U8S8, _desc_and_impl)


def _desc_and_impl():
    @T.prim_func(s_tir=True)
    def _desc(A: T.Buffer((4,), "uint8", offset_factor=1), B: T.Buffer((16, 4), "int8", offset_factor=1),
              C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            for i in T.serial(0, 16):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    @T.prim_func(s_tir=True)
    def _impl_bytes(A: T.Buffer((4,), "uint8", offset_factor=1), B: T.Buffer((16, 4), "int8", offset_factor=1),
                    C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            a4 = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"), C.vload([0], dtype="int32x16"),
                T.reinterpret(T.broadcast(a4, 16), dtype="int8x64"), B.vload([0, 0], dtype="int8x64"),
                dtype="int32x16")

    @T.prim_func(s_tir=True)
    def _impl_words(A: T.Buffer((4,), "uint8", offset_factor=1), B: T.Buffer((16, 4), "int8", offset_factor=1),
                    C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            a4 = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"), C.vload([0], dtype="int32x16"),
                T.broadcast(a4, 16), T.reinterpret(B.vload([0, 0], dtype="int8x64"), dtype="int32x16"),
                dtype="int32x16")

    return _desc, _impl_bytes if _byte_operands() else _impl_words
