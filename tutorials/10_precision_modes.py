"""Tutorial 10: precision modes on a Transformer block (CANN's ``--precision_mode``), their accuracy and their
modeled GM bytes, and an fp16 ONNX model.

What happens:
  1. the repo builds a BERT-style encoder layer (post-LN: attention, residual + LayerNorm, GELU FFN, residual +
     LayerNorm; random weights) as ONNX and imports it;
  2. ``compile_model(..., precision_mode=...)`` compiles it as float32 (``must_keep_origin_dtype``), with
     ``allow_mix_precision`` (fp16 between kernels, except the outputs of kernels ending in a softmax, norm,
     reduction or exp/log) and with ``force_fp16``, each with ``verify=True`` against ONNX Runtime on the
     float32 model: a 16-bit build is checked by its largest error on the output's scale and its cosine;
  3. for each: the kernels with their GM dtypes (inputs -> output; every kernel computes in float32 vectors on
     the host and converts at its loads and stores), the GM bytes of the *modeled* NPU and the accuracy;
  4. the same layer converted to fp16 by ONNX Runtime's ``convert_float_to_float16`` compiled as it is (an fp16
     model stays fp16 between kernels) and compared with ONNX Runtime running that fp16 model.

Run:  .venv/bin/python tutorials/10_precision_modes.py [--seq 128 --hidden 768 --heads 12 --ffn 3072]
"""

import argparse
import os

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import numpy as np  # noqa: E402

import tvm_ascendfuse as af  # noqa: E402
from tvm_ascendfuse.cli import precision_cell  # noqa: E402
from tvm_ascendfuse.frontend import import_onnx  # noqa: E402
from tvm_ascendfuse.verify import onnxruntime_reference  # noqa: E402
from tvm_ascendfuse.workloads import bert_layer  # noqa: E402

MODES = ("must_keep_origin_dtype", "allow_mix_precision", "force_fp16")


def show(label, result):
    traffic = result.report.sections["traffic"]["ours"]
    print(f"== {label}")
    for k in result.report.kernels:
        print(f"   {k.get('rule', '?'):22s} {precision_cell(k):16s} {'+'.join(k.get('ops', []))[:70]}")
    kept = (result.report.sections.get("precision") or {}).get("kept_fp32", [])
    if kept:
        print("   kept in float32 (mixed precision's keep-list): "
              + ", ".join(f"{k['op']} ({k['tensor']})" for k in kept))
    out = result.verification.outputs[0]
    cos = f", cosine {out.cosine:.6f}" if out.cosine is not None else ""
    print(f"   GM MB (modeled NPU) {traffic['gm_bytes'] / 1e6:.2f}; modeled NPU us {traffic['modeled_time_us']:.1f}")
    print(f"   vs ONNX Runtime: max |ours - ort| / max |ort| = {out.max_rel:.2e}{cos}: "
          f"{'OK' if out.ok else 'MISMATCH'}\n")
    return traffic["gm_bytes"], out


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ffn", type=int, default=3072)
    args = ap.parse_args()

    model = bert_layer(seq=args.seq, hidden=args.hidden, heads=args.heads, ffn=args.ffn)
    mod = import_onnx(model)
    ok, gm = True, {}
    for mode in MODES:
        result = af.compile_model(mod, "ascend910b", precision_mode=mode, verify=True,
                                  reference=onnxruntime_reference(model), reference_name="onnxruntime")
        gm[mode], out = show(mode, result)
        ok &= out.ok

    from onnxruntime.transformers.float16 import convert_float_to_float16

    fp16 = convert_float_to_float16(model, keep_io_types=False)
    result = af.compile_model(import_onnx(fp16), "ascend910b", verify=True, reference=onnxruntime_reference(fp16),
                              reference_name="onnxruntime")
    _, out = show("fp16 ONNX model (must_keep_origin_dtype)", result)
    ok &= out.ok

    ratio = gm["force_fp16"] / gm["must_keep_origin_dtype"]
    print(f"force_fp16 moves {ratio:.2f}x the GM bytes of the float32 build "
          f"(allow_mix_precision {gm['allow_mix_precision'] / gm['must_keep_origin_dtype']:.2f}x)")
    ok &= ratio < 0.6
    print(f"tutorial checks: {'OK' if ok else 'FAILED'}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    run()
