"""Tutorial 8: greedy text generation with a KV cache through compiled modules, one build for every step.

What happens:
  1. a tiny LLaMA-style causal LM (transformers' ``LlamaForCausalLM``, random weights, grouped-query
     attention) is wrapped so that its KV cache is explicit tensors (``workloads.torch_models.KVCacheStep``)
     and exported to ONNX twice: the *prefill* (the prompt, no cache) and the *decode step* (one token and
     the cache so far), the step with the cache length a symbolic dimension (``torch.export.Dim``);
  2. both compile with the ``ascendfuse`` pipeline; the step's report says which size is symbolic and which
     kernels depend on it: that one build serves every cache length;
  3. a greedy loop (prefill, then one step a token, feeding back the cache the step returned, as TVM
     tensors) generates tokens, compared with transformers' own ``model.generate(do_sample=False)``;
  4. the step is checked against ONNX Runtime at a few cache lengths, relative to the output's scale.

Needs PyTorch and transformers (the ``models`` extra); without them this tutorial says so and exits.

Run:  .venv/bin/python tutorials/08_generate.py [--hidden 128 --layers 2 --heads 4 --kv-heads 2 --prompt 8 --new 24]
"""

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

try:
    import torch

    from tvm_ascendfuse.torch_compat import import_transformers
    transformers = import_transformers()
except ImportError:
    print("PyTorch and transformers are not installed (pip install -e '.[models]'); skipping this tutorial")
    sys.exit(0)

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_ascendfuse as af  # noqa: E402
from tvm_ascendfuse.frontend import import_onnx  # noqa: E402
from tvm_ascendfuse.workloads.torch_models import KVCacheStep, kv_cache_layout, kv_cache_names  # noqa: E402


def tiny_llama(args):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.hidden * 3, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
        max_position_embeddings=args.prompt + args.new + 64)
    config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(config).eval()


def export(model, path: Path, tokens: int, past: int) -> None:
    """One call of the model with an explicit cache: ``tokens`` new ids, a cache of ``past`` tokens (0: none);
    a decode step's cache length is exported symbolic."""
    layers, kv_heads, head_dim = kv_cache_layout(model.config)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    cache = tuple(torch.randn(1, kv_heads, past, head_dim) for _ in range(2 * layers)) if past else ()
    options = {}
    if past:
        length = torch.export.Dim("past", min=1, max=model.config.max_position_embeddings - 2)
        options["dynamic_shapes"] = ({}, tuple({2: length} for _ in cache))
    with warnings.catch_warnings():      # the exporter's deprecation notes say nothing about this model
        warnings.simplefilter("ignore")
        program = torch.onnx.export(KVCacheStep(model), (ids, *cache), dynamo=True, verbose=False,
                                    input_names=["input_ids"] + (kv_cache_names(layers, "past") if past else []),
                                    output_names=["logits"] + kv_cache_names(layers, "present"), **options)
    program.save(str(path))


class Compiled:
    """The prefill and the decode step as TVM VMs; the cache stays in TVM tensors between calls."""

    def __init__(self, prefill, step):
        self.prefill = relax.VirtualMachine(prefill.executable, tvm.cpu())["main"]
        self.step = relax.VirtualMachine(step.executable, tvm.cpu())["main"]

    def generate(self, prompt: np.ndarray, new_tokens: int) -> list[int]:
        logits, *cache = self.prefill(tvm.runtime.tensor(prompt))
        tokens = [int(logits.numpy().argmax())]
        while len(tokens) < new_tokens:
            ids = tvm.runtime.tensor(np.array([[tokens[-1]]], dtype=np.int64))
            logits, *cache = self.step(ids, *cache)
            tokens.append(int(logits.numpy().argmax()))
        return tokens


def step_agrees_with_onnxruntime(path: Path, step, lengths) -> bool:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    vm = relax.VirtualMachine(step.executable, tvm.cpu())["main"]
    rng = np.random.default_rng(1)
    good = True
    for length in lengths:
        feeds = {}
        for i in sess.get_inputs():
            feeds[i.name] = (np.array([[7]], dtype=np.int64) if i.name == "input_ids" else
                             rng.standard_normal((1, i.shape[1], length, i.shape[3])).astype("float32"))
        ref = sess.run(None, feeds)
        ours = [o.numpy() for o in vm(*[tvm.runtime.tensor(a) for a in feeds.values()])]
        worst = max(float(np.max(np.abs(o - r))) / float(np.max(np.abs(r))) for o, r in zip(ours, ref))
        print(f"   cache length {length:4d}: max |ours - ORT| / max |ORT| = {worst:.1e}")
        good &= worst <= 1e-3 and all(o.shape == r.shape for o, r in zip(ours, ref))
    return good


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--new", type=int, default=24, help="tokens to generate")
    ap.add_argument("--out", default=None, help="folder for the two ONNX files (default: a temporary one)")
    args = ap.parse_args()
    model = tiny_llama(args)
    folder = Path(args.out or tempfile.mkdtemp(prefix="tutorial_generate_"))
    folder.mkdir(parents=True, exist_ok=True)

    # 1. two exports: the prompt's prefill (static length) and the decode step (symbolic cache length)
    prefill_path, step_path = folder / "prefill.onnx", folder / "step.onnx"
    export(model, prefill_path, tokens=args.prompt, past=0)
    export(model, step_path, tokens=1, past=args.prompt)

    # 2. compile both; the step's report names the symbolic size and the kernels that depend on it
    prefill = af.compile_model(import_onnx(prefill_path), target="ascend910b")
    step = af.compile_model(import_onnx(step_path), target="ascend910b")
    report = step.report.to_dict()
    depending = [k for k in report["kernels"] if "past" in k.get("symbolic", ())]
    print(f"prefill: {len(prefill.report.kernels)} kernels; decode step: {len(report['kernels'])} kernels, "
          f"symbolic sizes {report.get('symbolic_sizes')}, {len(depending)} kernels depend on 'past':")
    for k in depending:
        print(f"   {k.get('rule', '?'):16s} {'+'.join(k['ops'])[:90]}")
    rules = {k.get("rule") for k in report["kernels"]}
    print(f"   schedule rules of the step: {sorted(r for r in rules if r)}")

    # 3. greedy generation, ours vs transformers
    prompt = np.random.default_rng(0).integers(0, args.vocab, size=(1, args.prompt), dtype=np.int64)
    ours = Compiled(prefill, step).generate(prompt, args.new)
    with torch.no_grad():
        eager = model.generate(torch.from_numpy(prompt), max_new_tokens=args.new, min_new_tokens=args.new,
                               do_sample=False, pad_token_id=0)[0, args.prompt:].tolist()
    print(f"\nprompt {prompt[0].tolist()}\nours          {ours}\ntransformers  {eager}")

    # 4. the one step build at several cache lengths, against ONNX Runtime
    print("\nthe decode step build at cache lengths it was not exported with:")
    lengths = sorted({1, args.prompt, args.prompt + args.new, model.config.max_position_embeddings - 2})
    agrees = step_agrees_with_onnxruntime(step_path, step, lengths)

    good = ours == eager and agrees and report.get("symbolic_sizes") == ["past"]
    print("\ntutorial checks: " + ("OK" if good else "FAILED"))
    if not good:
        raise SystemExit(1)


if __name__ == "__main__":
    run()
