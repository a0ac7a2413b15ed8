"""The NPU traffic model under a precision plan: 16-bit tensors counted in 16-bit bytes."""

import tvm_ascendfuse as af
from tests.precision.test_storage import _block


def test_gm_bytes_about_half():
    mod, _ = _block("float32")
    fp32 = af.compile_model(mod, portable=True).report.sections["traffic"]["ours"]["gm_bytes"]
    fp16 = af.compile_model(mod, portable=True, precision_mode="force_fp16").report.sections["traffic"]["ours"]
    # input x and output stay float32 (the signature's dtypes): a little over half
    assert 0.5 * fp32 <= fp16["gm_bytes"] <= 0.62 * fp32


def test_fp16_model_counted_as_stored():
    """A model stored in fp16 is counted in fp16 bytes whatever the kernels compute in (plus its entry
    conversion's copy, 16 KiB of 80: the first GEMM reads its input one element at a time, so the host keeps
    that conversion)."""
    mod16, _ = _block("float16")
    mod32, _ = _block("float32")
    fp16 = af.compile_model(mod16, portable=True).report.sections["traffic"]["ours"]["gm_bytes"]
    fp32 = af.compile_model(mod32, portable=True).report.sections["traffic"]["ours"]["gm_bytes"]
    assert 0.5 * fp32 <= fp16 <= 0.62 * fp32
