"""Weight pre-packing for the GEMM/conv rules, done the way TVM's own CPU weight prepack does it.

A weight read is re-laid out (GEMM: (N/nr, K, nr); conv: (OC/ocb, IC, KH, KW, ocb)) through a copy block
at the root of the kernel, annotated ``meta_schedule.layout_rewrite_preproc``. Then, at Relax level:

* ``relax.transform.AttachAttrLayoutFreeBuffers()`` (before scheduling) marks in each PrimFunc the
  parameters that are Relax constants or model weights: only those are packed, so a weight computed at
  run time keeps the unpacked schedule;
* ``relax.transform.SplitLayoutRewritePreproc()`` (after scheduling) moves the copy block into its own
  PrimFunc called on the weight, and ``relax.transform.FoldConstant()`` evaluates that call at compile
  time, so the kernel receives the packed constant and the packing costs nothing per inference.

Without those passes the copy block simply runs inside the kernel: slower, still exact.
"""

from __future__ import annotations

from tvm import s_tir, tirx

LAYOUT_FREE_ATTR = "layout_free_buffers"
PREPROC_ANNOTATION = "meta_schedule.layout_rewrite_preproc"


def is_layout_free(func, weight) -> bool:
    """Is ``weight`` a parameter the pipeline marks as a constant (packed once at compile time)?"""
    attrs = func.attrs
    if attrs is None or LAYOUT_FREE_ATTR not in attrs:
        return False
    free = {int(i) for i in attrs[LAYOUT_FREE_ATTR]}
    return any(p.same_as(weight) and i in free for i, p in enumerate(func.params))


def packable_param(sch: s_tir.Schedule, buf) -> int | None:
    """Parameter index of ``buf`` when it is a layout-free (constant) parameter with a static shape."""
    func = sch.mod["main"]
    if not is_layout_free(func, buf):
        return None
    return next((i for i, p in enumerate(func.params) if p.same_as(buf) and isinstance(p.ty, tirx.BufferType)
                 and all(isinstance(d, tirx.IntImm) for d in p.ty.shape)), None)


def mark_prepack(sch: s_tir.Schedule, block, read_index: int, index_map) -> object:
    """Copy the weight read by ``block`` into a buffer with layout ``index_map`` in a preproc block."""
    copy = sch.cache_read(block, read_index, "global")
    sch.transform_layout(block, ("read", read_index), index_map)
    sch.annotate(copy, PREPROC_ANNOTATION, 1)
    return copy


def panel_pack_map(info, nr: int, ndim: int):
    """B[..., k, n] (any axis order; ``info``: the GemmBlock) -> B'[..., n // nr, k, n % nr]: each panel of
    ``nr`` columns is contiguous for every k, one run of memory per panel."""
    others = [d for d in range(ndim) if d not in (info.b_n_axis, info.b_k_axis)]

    def index_map(*axes):
        n, k = axes[info.b_n_axis], axes[info.b_k_axis]
        return [*(axes[d] for d in others), n // nr, k, n % nr]

    return index_map
