"""RoundWeightsPass: a float32 model converted by a 16-bit mode gets its GEMM/conv weights' 16-bit values."""

import numpy as np
import pytest

import tvm_ascendfuse as af
from tvm_ascendfuse.precision.round_weights import round_to
from tests.precision.test_storage import _block


def test_round_to_bfloat16_nearest_even():
    values = np.array([1.0, 1.00390625, 1.005859375, 1.0 + 2 ** -7, -3.14159265, 65504.0, np.inf, 1e-40],
                      dtype=np.float32)
    got = round_to(values, "bfloat16")
    assert np.all(got.view(np.uint32)[np.isfinite(values)] & 0xFFFF == 0)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1); just above it rounds up
    assert got[1] == 1.0 and got[2] == np.float32(1.0 + 2 ** -7) and got[3] == np.float32(1.0 + 2 ** -7)
    assert abs(got[4] - values[4]) <= abs(values[4]) * 2 ** -8 and np.isinf(got[6])
    np.testing.assert_array_equal(round_to(values[:6], "float16"), values[:6].astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("mode,dtype", [("force_fp16", "float16"), ("force_bf16", "bfloat16")])
def test_weights_rounded_only_under_converting_modes(mode, dtype):
    mod, _ = _block("float32")
    res = af.compile_model(mod, portable=True, precision_mode=mode)
    rec = res.report.get("RoundWeights")
    assert rec.effect_times == 1 and rec.match_times == 1
    plain = af.compile_model(mod, portable=True)
    assert plain.report.get("RoundWeights").match_times == 0
