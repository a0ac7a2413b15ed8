"""What the dot-product GEMM rules (``matmul_int8.py``: VNNI; ``matmul_bf16.py``: AVX512-BF16) share: the GEMM
they take (2-D B, no batch on B, both operands parameters, no other reduction in the kernel), B packed to
``B'[n // lanes, k // depth, n % lanes, k % depth]`` (one vector of ``lanes`` columns x ``depth`` products a
step), and the register tile's loop nest. Each rule keeps what differs: dtypes, the intrinsic, the accumulator
and epilogue placement."""

from __future__ import annotations

from tvm import s_tir

from .analysis import has_reduce


def dot_gemm_operands(sch: s_tir.Schedule, blocks, gi, info) -> bool:
    """Whether the GEMM ``blocks[gi]`` (``info``: ``analysis.find_gemm``) is one the dot-product rules take."""
    if info.batch or len(info.b_buf.shape) != 2:
        return False
    if any(has_reduce(sch, b) for i, b in enumerate(blocks) if i != gi):
        return False
    params = list(sch.mod["main"].params)
    # an operand computed in the kernel (a prologue): the generic rules stage it
    return all(any(p.same_as(buf) for p in params) for buf in (info.a_buf, info.b_buf))


def pair_packing(info, lanes: int, depth: int):
    """The index map packing B (as ``layout.mark_prepack`` takes it) into vectors of ``lanes`` columns x
    ``depth`` consecutive k."""
    b_axes = (info.b_k_axis, info.b_n_axis)

    def pack(*axes):
        k, n = axes[b_axes[0]], axes[b_axes[1]]
        return [n // lanes, k // depth, n % lanes, k % depth]
    return pack


def split_dot_tile(sch: s_tir.Schedule, gemm, info, mr: int, nv: int, lanes: int, depth: int,
                   depth_inside: bool = True):
    """The GEMM's loops as ``parallel(n-block, outer m, m-block) / k / mr rows / nv vectors / lanes, depth``
    (``depth_inside=False``: depth outside the lanes, for plain vector arithmetic). Returns
    ``(outer, ko, mi, nvo, ni, ki)``, or None when the GEMM's loops are not ``m.., n, k`` in that order."""
    loops = sch.get_loops(gemm)
    if sorted(info.m + [info.n, info.k]) != list(range(len(loops))) or info.k != len(loops) - 1 \
            or info.n != len(loops) - 2:
        return None
    m_outer = [loops[i] for i in info.m[:-1]]
    mo, mi = sch.split(loops[info.m[-1]], [None, mr])
    no, nvo, ni = sch.split(loops[-2], [None, nv, lanes])
    ko, ki = sch.split(loops[-1], [None, depth])
    sch.reorder(no, *m_outer, mo, ko, mi, nvo, *((ni, ki) if depth_inside else (ki, ni)))
    outer = sch.fuse(no, *m_outer, mo)
    sch.parallel(outer)
    return outer, ko, mi, nvo, ni, ki
