"""The command line as a user drives it: files written, numbers right, one-line errors with exit code 2."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax

from tvm_ascendfuse.cli import main
from tvm_ascendfuse.workloads import conv_bn_relu
from tests.helpers import assert_close

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "cbr.onnx"
    onnx.save(conv_bn_relu(in_channels=8, out_channels=16, hw=12), str(path))
    return path


def test_compile_writes_library_ir_and_report(small_model, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compile", str(small_model), "--target", "ascend910b", "-o", str(out), "--portable"]) == 0
    printed = capsys.readouterr().out
    assert "ConvBatchnormFusionPass" in printed and "ops before" in printed
    assert sorted(p.name for p in out.iterdir()) == ["cbr.fused.py", "cbr.so", "fusion_result.json"]
    report = json.loads((out / "fusion_result.json").read_text())
    assert report["graph_fusion"]["ConvBatchnormFusionPass"]["effect_times"] == 1
    assert report["summary"]["kernels_after"] == 1 and report["summary"]["ops_before"] >= 3
    traffic = report["traffic"]   # the CLI is the report tool: full table, TVM default row included
    assert traffic["tvm_default"]["launches"] > traffic["ours"]["launches"] == 1
    assert traffic["lower_bound"]["gm_bytes"] > 0
    assert "R.call_tir" in (out / "cbr.fused.py").read_text()

    x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype("float32")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(out / "cbr.so")), tvm.cpu())
    ours = vm["main"](tvm.runtime.tensor(x)).numpy()
    sess = ort.InferenceSession(small_model.read_bytes(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    assert_close(ours, ref, rtol=1e-4, atol=1e-4)

    assert main(["report", str(out / "fusion_result.json")]) == 0
    assert "ConvBatchnormFusionPass" in capsys.readouterr().out


def test_library_written_with_verify_loads_without_warnings(small_model, tmp_path):
    """``--verify`` runs the executable; TVM's VM then records an empty memory scope per constant, which a
    library exported afterwards carries and prints on every load ("Scope Loaded:"). The CLI writes the library
    first: loading it prints nothing."""
    out = tmp_path / "out"
    assert main(["compile", str(small_model), "-o", str(out), "--portable", "--verify", "--quiet"]) == 0
    code = ("import tvm; from tvm import relax; "
            f"relax.VirtualMachine(tvm.runtime.load_module({str(out / 'cbr.so')!r}), tvm.cpu())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Warning" not in proc.stderr + proc.stdout, proc.stderr[-2000:]


def test_switch_file_turns_pass_off(small_model, tmp_path):
    sw = tmp_path / "switch.json"
    sw.write_text(json.dumps({"Switch": {"GraphFusion": {"ConvBatchnormFusionPass": "off"}}}))
    out = tmp_path / "out"
    assert main(["compile", str(small_model), "--fusion-switch", str(sw), "-o", str(out), "--portable"]) == 0
    rec = json.loads((out / "fusion_result.json").read_text())["graph_fusion"]["ConvBatchnormFusionPass"]
    assert rec["match_times"] == 1 and rec["effect_times"] == 0
    assert rec["not_effective"][0]["reason"] == "switched_off"


def test_no_traffic_baseline_flag(small_model, tmp_path):
    out = tmp_path / "out"
    assert main(["compile", str(small_model), "-o", str(out), "--portable", "--no-traffic-baseline"]) == 0
    traffic = json.loads((out / "fusion_result.json").read_text())["traffic"]
    assert "tvm_default" not in traffic and traffic["ours"]["launches"] == 1


def _run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tvm_ascendfuse.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


@pytest.mark.parametrize("make_input, message", [
    (lambda d: d / "missing.onnx", "does not exist"),
    (lambda d: (d / "junk.onnx").write_bytes(b"\x08\x07garbage-not-protobuf" * 3) and d / "junk.onnx",
     "not a readable ONNX model"),
])
def test_bad_model_is_one_line_exit_2(tmp_path, make_input, message):
    path = make_input(tmp_path)
    proc = _run_cli("compile", str(path), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_truncated_model(small_model, tmp_path):
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(small_model.read_bytes()[: small_model.stat().st_size // 2])
    assert main(["compile", str(cut), "-o", str(tmp_path / "out")]) == 2


def test_bad_switch_and_target_files(small_model, tmp_path, capsys):
    sw = tmp_path / "switch.cfg"
    sw.write_text("NoSuchPass:off\n")
    assert main(["compile", str(small_model), "--fusion-switch", str(sw), "-o", str(tmp_path / "o")]) == 2
    assert "unknown fusion pass name(s) NoSuchPass" in capsys.readouterr().err
    tgt = tmp_path / "npu.json"
    tgt.write_text(json.dumps({"base": "ascend910b", "ub_bytes": -5}))
    assert main(["compile", str(small_model), "--target", str(tgt), "-o", str(tmp_path / "o")]) == 2
    assert "'ub_bytes' must be positive" in capsys.readouterr().err


def test_output_dir_under_a_file_is_refused(small_model, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["compile", str(small_model), "-o", str(blocker / "out")]) == 2
    assert "not writable" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_output_dir(small_model, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["compile", str(small_model), "-o", str(locked / "out")]) == 2
    assert "not writable" in capsys.readouterr().err


def test_patterns_lists_switches_and_patterns(capsys):
    assert main(["patterns"]) == 0
    out = capsys.readouterr().out
    assert "ConvBatchnormFusionPass" in out and "GraphFusion" in out and "UBFusion" in out
    assert "pattern ascendfuse." in out


def test_workload_writes_model(tmp_path, capsys):
    assert main(["workload", "mlp3", "-o", str(tmp_path / "m.onnx")]) == 0
    onnx.checker.check_model(onnx.load(str(tmp_path / "m.onnx")))
    assert main(["workload", "nope", "-o", str(tmp_path / "x.onnx")]) == 2
    assert "unknown workload 'nope'" in capsys.readouterr().err
