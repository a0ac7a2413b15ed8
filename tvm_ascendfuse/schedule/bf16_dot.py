"""The host's bfloat16 dot product as a TIR tensor intrinsic, for the bf16 GEMM rule (``matmul_bf16.py``).

``C[16] (float32) += sum_k A[k] (bf16) * B[i, k] (bf16)`` over 2 k: one AVX512-BF16 ``vdpbf16ps``, the pair
of A values broadcast to every lane, each lane of B holding the pair of its column. Twice the multiply-adds
of an fp32 FMA per instruction: a GEMM register tile measured 2.0x the same tile in fp32 FMAs on Zen 5, and
a 128x768x3072 GEMM + bias + ReLU 1.8x the float32 GEMM rule (955 vs 531 GFLOP/s, two threads).

LLVM's intrinsic takes ``<32 x bfloat>`` operands, which TVM's code generator cannot pass (it legalizes every
bfloat16 expression to float32 or uint16 before LLVM); so the intrinsic's body calls a three-line LLVM wrapper
taking the pairs as ``<16 x i32>`` (bit casts only), imported into the kernel by the ``pragma_import_llvm``
annotation ``IMPORT_ANNOTATION`` (``LLVM_WRAPPER``) and inlined by LLVM. The pairs are read as raw bits
(``reinterpret`` of a bfloat16 load; the A pair through its address, which also keeps TVM from widening the
kernel's bf16 copy of A to float32, ``BF16ComputeLegalize``), so no conversion runs in the inner loop.
"""

from __future__ import annotations

from tvm.script import tirx as T

from .common import register_intrin_once

DOT_16x2_BF16 = "ascendfuse_dot_16x2_bf16"
LANES = 16          # float32 lanes of one 512-bit accumulator
DEPTH = 2           # bf16 products one lane sums per step
WRAPPER = "ascendfuse_dpbf16ps_512"
IMPORT_ANNOTATION = "pragma_import_llvm"

LLVM_WRAPPER = f"""
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
define <16 x float> @{WRAPPER}(<16 x float> %c, ptr %a, <16 x i32> %b) {{
  %pair = load i32, ptr %a, align 2
  %a0 = insertelement <16 x i32> poison, i32 %pair, i32 0
  %a16 = shufflevector <16 x i32> %a0, <16 x i32> poison, <16 x i32> zeroinitializer
  %x = bitcast <16 x i32> %a16 to <32 x bfloat>
  %y = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %c, <32 x bfloat> %x, <32 x bfloat> %y)
  ret <16 x float> %r
}}
"""


def dot_16x2_bf16() -> str:
    """The intrinsic's name, registered in this process on first use (its TVMScript took about a second of
    every import of the package)."""
    return register_intrin_once(DOT_16x2_BF16, _desc_and_impl)


def _desc_and_impl():
    @T.prim_func(s_tir=True)
    def _desc(A: T.Buffer((2,), "bfloat16", offset_factor=1), B: T.Buffer((16, 2), "bfloat16", offset_factor=1),
              C: T.Buffer((16,), "float32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:2], B[0:16, 0:2])
            T.writes(C[0:16])
            for i in T.serial(0, 16):
                for k in T.serial(0, 2):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "float32") * T.cast(B[vi, vk], "float32")

    @T.prim_func(s_tir=True)
    def _impl(A: T.Buffer((2,), "bfloat16", offset_factor=1), B: T.Buffer((16, 2), "bfloat16", offset_factor=1),
              C: T.Buffer((16,), "float32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:2], B[0:16, 0:2])
            T.writes(C[0:16])
            C[T.ramp(T.int32(0), 1, 16)] = T.call_pure_extern(
                "float32x16", WRAPPER, C.vload([0], dtype="float32x16"),
                T.tvm_access_ptr(T.type_annotation("uint16"), A.data, A.elem_offset, 2, 1),
                T.reinterpret(B.vload([0, 0], dtype="bfloat16x32"), dtype="int32x16"))

    return _desc, _impl
