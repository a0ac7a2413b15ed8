"""The tutorials run end to end (each checks its own output against ONNX Runtime and exits non-zero if not)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(script, *args, cwd):
    proc = subprocess.run([sys.executable, str(ROOT / "tutorials" / script), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_conv_bn_relu_tutorial(tmp_path):
    out = _run("01_conv_bn_relu.py", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert "OK at 1e-4" in out


def test_llama_block_tutorial_small():
    out = _run("02_llama_block.py", "--seq", "16", "--hidden", "64", "--heads", "4", "--ffn", "96", cwd=ROOT)
    assert out.count("launches") == 3 and "within 1e-3: OK" in out
