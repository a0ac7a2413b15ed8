"""``torch.compile(model, backend="ascendfuse")``: pieces built by our pipeline agree with eager PyTorch,
dynamic dims build once, graph breaks and untranslatable ops leave the rest to eager with one logged line,
and training says it is inference only. Skipped without torch (an optional extra)."""

import logging
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.helpers import assert_close  # noqa: E402
from tvm_ascendfuse import torch_compile as tc  # noqa: E402
from tvm_ascendfuse.errors import OptionError, TargetError  # noqa: E402
from tvm_ascendfuse.workloads import torch_models  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {"portable": True}
EAGER_LINE = "runs in eager PyTorch"


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    tc.clear_cache()
    yield
    torch._dynamo.reset()


def compiled(model, **kwargs):
    return torch.compile(model, backend="ascendfuse", options=kwargs.pop("options", OPTIONS), **kwargs)


def check(fast, model, *args):
    with torch.no_grad():
        ours, ref = fast(*args), model(*args)
    flat = lambda v: [t.numpy() for t in (v if isinstance(v, (tuple, list)) else [v])]
    assert_close(flat(ours), flat(ref), rtol=1e-4, atol=1e-4)
    return ours


class MLP(torch.nn.Module):
    def __init__(self, d=32, h=64):
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, h), torch.nn.Linear(h, d)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x))) + x


def eager_lines(caplog):
    return [r for r in caplog.records if r.name == tc.__name__ and EAGER_LINE in r.getMessage()]


def test_mlp_matches_eager_through_our_build():
    model = MLP().eval()
    out = check(compiled(model), model, torch.randn(4, 32))
    assert isinstance(out, torch.Tensor)
    assert tc.stats["builds"] == 1 and tc.stats["eager"] == 0
    (_, result), = tc._CACHE.values()
    assert any("matmul" in (k.get("rule") or "") or "gemv" in (k.get("rule") or "")
               for k in result.report.kernels), result.report.kernels


def test_inference_mode_calls_are_built():
    model, x = MLP().eval(), torch.randn(4, 32)
    fast = compiled(model)
    with torch.inference_mode():
        ours, ref = fast(x), model(x)
        again = fast(x)              # inference tensors have no version counter: the weight check copes
    assert_close([ours.numpy(), again.numpy()], [ref.numpy(), ref.numpy()], rtol=1e-4, atol=1e-4)
    assert tc.stats["builds"] == 1 and tc.stats["eager"] == 0


def test_inputs_reach_the_vm_without_a_copy():
    import tvm

    x = torch.randn(8, 16)
    assert torch.from_dlpack(tc._to_tvm(torch, tvm, x)).data_ptr() == x.data_ptr()
    view = x[:, 1:]   # neither dense nor 64-byte aligned: copied, and still right
    assert torch.equal(torch.from_dlpack(tc._to_tvm(torch, tvm, view)), view)


def test_conv_block_folds_batchnorm():
    model, (x,) = torch_models.conv_block(in_channels=3, out_channels=8, hw=10)
    check(compiled(model.eval()), model, x)
    (_, result), = tc._CACHE.values()
    assert result.report.get("ConvBatchnormFusionPass").effect_times == 1


class Breaks(torch.nn.Module):
    """A print and a branch on a tensor's value: dynamo hands over the pieces between them."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.a(x).relu()
        print("between the pieces")
        if y.sum() > 0:
            return self.b(y)
        return self.b(-y)


def test_graph_breaks_compile_each_piece(capsys):
    model = Breaks().eval()
    fast = compiled(model)
    x = torch.randn(3, 16)
    check(fast, model, x)
    assert "between the pieces" in capsys.readouterr().out
    assert tc.stats["backend_calls"] >= 2 and tc.stats["builds"] == tc.stats["backend_calls"]
    assert tc.stats["eager"] == 0


class SpecialOp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(torch.special.i0(self.fc(x)))   # i0: no converter in TVM's frontend


def test_untranslatable_piece_runs_eagerly_with_one_line(caplog):
    model = SpecialOp().eval()
    fast = compiled(model)
    with caplog.at_level(logging.WARNING, logger=tc.__name__):
        check(fast, model, torch.randn(2, 8))
        check(fast, model, torch.randn(2, 8))
    lines = eager_lines(caplog)
    assert len(lines) == 1 and "i0" in lines[0].getMessage(), [r.getMessage() for r in caplog.records]
    assert tc.stats["eager"] == 1 and tc.stats["builds"] == 0


class SeqModel(torch.nn.Module):
    """Reads the sequence length as a size (a SymInt in the graph when the dim is dynamic)."""

    def __init__(self):
        super().__init__()
        self.proj, self.norm = torch.nn.Linear(32, 32), torch.nn.LayerNorm(32)

    def forward(self, x):
        b, n, d = x.shape
        y = self.norm(self.proj(x)).view(b, n, 4, d // 4).transpose(1, 2)
        return (y @ y.transpose(-1, -2)).softmax(-1).sum(1)


@pytest.mark.parametrize("how", ["mark_dynamic", "dynamic=True"])
def test_new_sequence_length_does_not_recompile(how):
    model = SeqModel().eval()
    fast = compiled(model, dynamic=True) if how == "dynamic=True" else compiled(model)
    for n in (5, 9, 17):
        x = torch.randn(2, n, 32)
        if how == "mark_dynamic":
            torch._dynamo.mark_dynamic(x, 1)
        check(fast, model, x)
    assert tc.stats["backend_calls"] == 1 and tc.stats["builds"] == 1, dict(tc.stats)
    (mod, _), = tc._CACHE.values()
    assert "tir_var_lower_bound" in mod.script()   # the length is a variable of main's signature


def test_recompile_of_the_same_graph_reuses_the_build():
    model = MLP().eval()
    x = torch.randn(4, 32)
    check(compiled(model), model, x)
    torch._dynamo.reset()                       # dynamo forgets its code; our build cache stays
    check(compiled(model), model, x)
    assert tc.stats["backend_calls"] == 2 and tc.stats["builds"] == 1 and tc.stats["cache_hits"] == 1


def test_another_instance_gets_its_own_weights():
    # dynamo shares compiled code between instances of one class (their weights are graph inputs): the
    # build holds the first instance's weights as constants and must not answer for the second with them
    first, second = MLP().eval(), MLP().eval()
    x = torch.randn(4, 32)
    check(compiled(first), first, x)
    check(compiled(second), second, x)
    check(compiled(first), first, x)           # each instance's build is kept: no third build
    assert tc.stats["builds"] == 2 and tc.stats["backend_calls"] == 1
    with torch.no_grad():
        second.up.weight.mul_(2.0)             # an in-place update of a weight the build holds
    check(compiled(second), second, x)
    assert tc.stats["builds"] == 3


def test_failing_build_runs_eagerly_with_one_line(caplog, monkeypatch):
    import tvm_ascendfuse.api

    def broken(*args, **kwargs):
        raise RuntimeError("a kernel did not lower")

    monkeypatch.setattr(tvm_ascendfuse.api, "compile_model", broken)
    model = MLP().eval()
    with caplog.at_level(logging.WARNING, logger=tc.__name__):
        check(compiled(model), model, torch.randn(2, 32))
    lines = eager_lines(caplog)
    assert len(lines) == 1 and "a kernel did not lower" in lines[0].getMessage()


def test_training_runs_eagerly_and_says_inference_only(caplog):
    model = MLP()
    fast = compiled(model)
    x = torch.randn(4, 32)
    with caplog.at_level(logging.WARNING, logger=tc.__name__):
        out = fast(x)
    out.sum().backward()                        # gradients flow: the piece ran in eager PyTorch
    assert model.up.weight.grad is not None
    assert any("inference only" in r.getMessage() for r in caplog.records)
    assert tc.stats["builds"] == 0


def test_options_are_checked():
    model, x = MLP().eval(), torch.randn(2, 32)
    with pytest.raises(Exception, match="unknown torch.compile option") as err:
        with torch.no_grad():
            compiled(model, options={"targte": "ascend910b"})(x)
    assert isinstance(err.value, OptionError) or isinstance(err.value.__cause__, OptionError) \
        or "OptionError" in str(err.value)
    with pytest.raises(TargetError):
        tc.BackendOptions.parse({"target": "no-such-npu"})
    import inspect

    from tvm_ascendfuse.api import compile_model

    if "precision_mode" in inspect.signature(compile_model).parameters:
        assert tc.BackendOptions.parse({"precision_mode": "force_fp32"}).extra == {"precision_mode": "force_fp32"}
    else:
        with pytest.raises(OptionError, match="no precision modes"):
            tc.BackendOptions.parse({"precision_mode": "force_fp32"})


def test_verify_option_checks_against_eager():
    model = MLP().eval()
    check(compiled(model, options={"portable": True, "verify": True}), model, torch.randn(4, 32))
    (_, result), = tc._CACHE.values()
    assert result.report.sections["verify"]["ok"] and result.report.sections["verify"]["reference"] == \
        "pytorch (eager)"


def test_backend_is_registered_by_name_and_declared_as_entry_point():
    import tomllib

    assert "ascendfuse" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("ascendfuse") is tc.ascendfuse_backend
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    value = data["project"]["entry-points"]["torch_dynamo_backends"]["ascendfuse"]
    # what dynamo does with an installed package's entry point: load it and register what it names
    assert EntryPoint("ascendfuse", value, "torch_dynamo_backends").load() is tc.ascendfuse_backend


def test_package_imports_without_registering_anything():
    import subprocess

    code = "import tvm_ascendfuse, sys; print('tvm_ascendfuse.torch_compile' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


class Scaled(torch.nn.Module):
    """A float attribute: under ``dynamic=True`` dynamo passes it as a 0-d tensor input (read with .item())."""

    def __init__(self):
        super().__init__()
        self.fc, self.eps, self.scale = torch.nn.Linear(16, 16), 1e-3, 0.25

    def forward(self, x):
        q = self.fc(x).view(1, x.shape[0], 2, 8).transpose(1, 2)
        # where torch needs a Python float (an op's scale or epsilon argument), not a tensor
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q, scale=self.scale)
        return torch.nn.functional.layer_norm(a, (8,), eps=self.eps)


def test_python_number_inputs_are_bound_and_followed():
    model = Scaled().eval()
    fast = compiled(model, dynamic=True)
    check(fast, model, torch.randn(3, 16))
    assert tc.stats["builds"] == 1 and tc.stats["eager"] == 0
    model.eps, model.scale = 0.5, 2.0      # the same graph with other numbers: never the old constants
    check(fast, model, torch.randn(5, 16))


# ---- Hugging Face models (transformers is an optional extra) -----------------------------------------------
def _transformers():
    pytest.importorskip("transformers")
    from benchmarks.public_models import _transformers as tf

    return tf()


def _tiny_llama(tf, layers=2):
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=128)
    return tf.LlamaForCausalLM(cfg).eval()


def test_tiny_llama_generate_gives_eager_tokens():
    tf = _transformers()
    model = _tiny_llama(tf)
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False)
        model.forward = torch.compile(model.forward, backend="ascendfuse", options=OPTIONS, dynamic=True)
        got = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert got.tolist() == want.tolist()
    # the prompt and the decode step: one build each, every later step (a longer cache) reuses the second.
    # Two layers: both read one scaled RoPE table, an op the grouping recomputes in several kernels
    assert tc.stats["builds"] == 2 and tc.stats["eager"] == 0, dict(tc.stats)


def test_small_bert_with_a_dynamic_sequence_length():
    # BERT slices its position-id buffer (max_position_embeddings) to the sequence length: the slice must
    # keep the length symbolic and equal to the embeddings' (torch_frontend._slice), or the sum loses its shape
    tf = _transformers()
    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64)
    model = tf.BertModel(cfg).eval()
    fast = compiled(model)
    for n in (12, 29):
        ids = torch.randint(0, 100, (1, n), generator=torch.Generator().manual_seed(n))
        torch._dynamo.mark_dynamic(ids, 1)
        with torch.no_grad():
            assert_close(fast(ids).last_hidden_state.numpy(), model(ids).last_hidden_state.numpy(),
                         rtol=1e-4, atol=1e-4)
    assert tc.stats["builds"] == 1 and tc.stats["eager"] == 0 and tc.stats["backend_calls"] == 1, dict(tc.stats)


# ---- full-size models (slow) -------------------------------------------------------------------------------
@pytest.mark.slow
def test_resnet50_matches_eager():
    from benchmarks.public_models import MODELS

    model, (x,), _ = MODELS["resnet50"].build()
    check(compiled(model.eval()), model, x)
    assert tc.stats["builds"] == 1 and tc.stats["eager"] == 0


@pytest.mark.slow
def test_bert_base_matches_eager():
    from benchmarks.public_models import MODELS

    _transformers()
    model, (ids,), _ = MODELS["bert"].build()
    check(compiled(model.eval()), model, ids)
    assert tc.stats["builds"] == 1 and tc.stats["eager"] == 0


@pytest.mark.slow
def test_llama_generate_four_layers_gives_eager_tokens():
    tf = _transformers()
    model = _tiny_llama(tf, layers=4)
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=12, do_sample=False)
        model.forward = torch.compile(model.forward, backend="ascendfuse", options=OPTIONS, dynamic=True)
        got = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert got.tolist() == want.tolist()
    assert tc.stats["builds"] == 2 and tc.stats["eager"] == 0, dict(tc.stats)
