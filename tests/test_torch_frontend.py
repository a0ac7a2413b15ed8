"""The PyTorch frontend: from_torch and .pt2 files reach the same kernels as the ONNX export of the same
block, and the compiled model matches eager PyTorch. Skipped without torch (an optional extra)."""

import pytest

torch = pytest.importorskip("torch")

import tvm_ascendfuse as af  # noqa: E402
from tests.helpers import assert_close, run_vm  # noqa: E402
from tvm_ascendfuse.errors import ModelError, UnsupportedOpError  # noqa: E402
from tvm_ascendfuse.frontend import import_onnx  # noqa: E402
from tvm_ascendfuse.torch_frontend import import_exported_program  # noqa: E402
from tvm_ascendfuse.workloads import bert_layer, conv_bn_relu, llama_block  # noqa: E402
from tvm_ascendfuse.workloads import torch_models  # noqa: E402

# (torch builder, ONNX builder, sizes for both): the same block written by each frontend's users.
BLOCKS = {
    "conv_block": (torch_models.conv_block, conv_bn_relu, dict(in_channels=8, out_channels=16, hw=12)),
    "bert_layer": (torch_models.bert_layer, bert_layer, dict(seq=16, hidden=64, heads=4, ffn=128)),
    "llama_block": (torch_models.llama_block, llama_block, dict(seq=16, hidden=64, heads=4, ffn=96)),
}


def eager(model, args):
    with torch.no_grad():
        return model(*args).numpy()


@pytest.mark.parametrize("name", list(BLOCKS))
def test_same_kernels_as_onnx_and_matches_eager(name):
    torch_builder, onnx_builder, sizes = BLOCKS[name]
    model, args = torch_builder(**sizes)
    result = af.compile_model(af.from_torch(model, args), portable=True)
    ours = run_vm(result.executable, [a.numpy() for a in args])
    assert_close(ours, eager(model, args), rtol=1e-4, atol=1e-4)
    onnx_result = af.compile_model(import_onnx(onnx_builder(**sizes)), portable=True)
    assert len(result.report.kernels) == len(onnx_result.report.kernels), (
        [k["ops"] for k in result.report.kernels], [k["ops"] for k in onnx_result.report.kernels])
    assert sorted(k.get("rule") for k in result.report.kernels) == \
        sorted(k.get("rule") for k in onnx_result.report.kernels)


def test_batchnorm_uses_running_statistics():
    model, args = torch_models.conv_block(in_channels=3, out_channels=4, hw=5)
    mod = af.from_torch(model, args)
    result = af.compile_model(mod, portable=True)
    assert result.report.get("ConvBatchnormFusionPass").effect_times == 1
    assert_close(run_vm(result.executable, [args[0].numpy()]), eager(model, args),
                               rtol=1e-4, atol=1e-4)


def test_training_mode_is_restored():
    model, args = torch_models.conv_block(in_channels=3, out_channels=4, hw=5)
    model.train()
    af.from_torch(model, args)
    assert model.training


class _ScaledAttention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)


def test_sdpa_scale_and_mask_kept():
    gen = torch.Generator().manual_seed(0)
    args = tuple(torch.randn(s, generator=gen) for s in [(1, 2, 5, 4), (1, 2, 7, 4), (1, 2, 7, 3), (1, 1, 5, 7)])
    model = _ScaledAttention()
    result = af.compile_model(af.from_torch(model, args), portable=True)
    assert result.report.get("ScaledDotProductAttentionFusionPass").effect_times == 1
    assert_close(run_vm(result.executable, [a.numpy() for a in args]), eager(model, args),
                               rtol=1e-4, atol=1e-4)


def test_pt2_file_and_errors(tmp_path):
    model, args = torch_models.llama_block(seq=8, hidden=32, heads=2, ffn=48)
    path = tmp_path / "block.pt2"
    torch.export.save(torch.export.export(model, args), str(path))
    result = af.compile_model(import_exported_program(path), portable=True)
    assert_close(run_vm(result.executable, [args[0].numpy()]), eager(model, args),
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(ModelError, match="does not exist"):
        import_exported_program(tmp_path / "missing.pt2")
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ModelError, match="not a readable torch.export program"):
        import_exported_program(bad)
    with pytest.raises(ModelError, match="torch.nn.Module"):
        af.from_torch(lambda x: x, args)


class _Dropout(torch.nn.Module):
    def forward(self, q):
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)


def test_sdpa_dropout_is_an_error():
    with pytest.raises(UnsupportedOpError, match="dropout"):
        af.from_torch(_Dropout(), (torch.randn(1, 2, 4, 4),))


def test_cli_compiles_pt2_with_verify(tmp_path, capsys):
    import json

    import tvm
    from tvm import relax

    from tvm_ascendfuse.cli import main

    model, args = torch_models.bert_layer(seq=8, hidden=32, heads=2, ffn=64)
    path = tmp_path / "bert.pt2"
    torch.export.save(torch.export.export(model, args), str(path))
    assert main(["compile", str(path), "-o", str(tmp_path / "out"), "--portable", "--verify"]) == 0
    printed = capsys.readouterr().out
    assert "verify against pytorch (eager)" in printed and "OK" in printed
    report = json.loads((tmp_path / "out" / "fusion_result.json").read_text())
    assert report["summary"]["kernels_after"] == 3 and report["verify"]["ok"]
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "out" / "bert.so")), tvm.cpu())
    ours = vm["main"](tvm.runtime.tensor(args[0].numpy())).numpy()
    assert_close(ours, eager(model, args), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind,layers,bidirectional", [("LSTM", 2, False), ("GRU", 1, True)])
def test_recurrent_modules_match_eager(kind, layers, bidirectional):
    """nn.LSTM / nn.GRU: one layer kernel per layer, as the ONNX import gives (torch_recurrent; the variants:
    test_torch_recurrent.py)."""
    torch.manual_seed(0)
    rnn = getattr(torch.nn, kind)(6, 8, num_layers=layers, batch_first=True, bidirectional=bidirectional)

    class Outputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = rnn

        def forward(self, x):
            return self.rnn(x)[0]

    model, args = Outputs().eval(), (torch.randn(1, 3, 6),)
    result = af.compile_model(af.from_torch(model, args), portable=True)
    assert_close(run_vm(result.executable, [a.numpy() for a in args]), eager(model, args), rtol=1e-4, atol=1e-4)
    kernels = [k for k in result.report.kernels if k.get("rule") == "recurrence"]
    assert sum(k["launches"] for k in kernels) == layers, [(k.get("rule"), k["ops"]) for k in result.report.kernels]
