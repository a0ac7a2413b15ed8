"""Bad input: one clear line naming the problem, exit code 2, no traceback, nothing written to OUTDIR.

Each row of ``CASES`` builds one bad input in a temp dir and gives the text the error line must contain.
``python -m tests.reliability.test_bad_input`` prints the input -> message table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnx
import pytest
from onnx import TensorProto, helper

from tvm_ascendfuse.cli import main


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def relu_model(op="Relu", domain=""):
    """x -> Relu -> <op> -> y: a valid model, or one whose second op is unknown / not importable."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node(op, ["r"], ["y"], domain=domain)]
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(helper.make_graph(nodes, "g", [_vi("x", [2, 3])], [_vi("y", [2, 3])]),
                             opset_imports=opsets)


def _save(d, name, model):
    path = d / name
    onnx.save(model, str(path))
    return path


def _write(d, name, text):
    path = d / name
    path.write_text(text)
    return path


def _good(d):
    return _save(d, "good.onnx", relu_model())


def _truncated(d):
    good = _good(d).read_bytes()
    path = d / "cut.onnx"
    path.write_bytes(good[: len(good) // 2])
    return [str(path)]


def _custom_domain_op(d):
    return [str(_save(d, "custom.onnx", relu_model("FooBar", "com.example")))]


# (id, build(tmpdir) -> argv after "compile", substring of the one error line)
CASES = [
    ("missing model file", lambda d: [str(d / "nope.onnx")], "does not exist"),
    ("garbage bytes", lambda d: [str(_write(d, "junk.onnx", "\x08\x07not protobuf" * 5))],
     "is not a readable ONNX model"),
    ("truncated ONNX", _truncated, "is not a readable ONNX model"),
    ("empty graph", lambda d: [str(_save(d, "empty.onnx", helper.make_model(
        helper.make_graph([], "g", [_vi("x", [2])], [_vi("x", [2])]), opset_imports=[helper.make_opsetid("", 17)])))],
     "empty graph"),
    ("op unknown to ONNX (FooBar)", lambda d: [str(_save(d, "foobar.onnx", relu_model("FooBar")))],
     "operator 'FooBar', which is not an ONNX operator at opset 17"),
    ("custom-domain op (com.example.FooBar)", _custom_domain_op,
     "operators are not supported for frontend ONNX: FooBar"),
    ("ONNX op TVM's importer lacks (Det)", lambda d: [str(_save(d, "det.onnx", relu_model("Det")))],
     "operators are not supported for frontend ONNX: Det"),
    ("switch file: bad JSON", lambda d: [str(_good(d)), "--fusion-switch", str(_write(d, "s.json", '{"Switch": {'))],
     "fusion switch file is not valid JSON"),
    ("switch file: unknown pass", lambda d: [str(_good(d)), "--fusion-switch",
                                             str(_write(d, "s.json", json.dumps(
                                                 {"Switch": {"GraphFusion": {"NoSuchPass": "off"}}})))],
     "NoSuchPass"),
    ("switch file: bad value", lambda d: [str(_good(d)), "--fusion-switch",
                                          str(_write(d, "s.cfg", "ConvBatchnormFusionPass:maybe\n"))],
     "'maybe'"),
    ("switch file: flat line without ':'", lambda d: [str(_good(d)), "--fusion-switch",
                                                      str(_write(d, "s.cfg", "ConvBatchnormFusionPass off\n"))],
     "is not of the form PassName:on|off"),
    ("target file: missing fields, no base", lambda d: [str(_good(d)), "--target",
                                                        str(_write(d, "t.json", json.dumps({"ub_bytes": 196608})))],
     "is missing field(s)"),
    ("target file: negative field", lambda d: [str(_good(d)), "--target",
                                               str(_write(d, "t.json", json.dumps({"base": "ascend910b",
                                                                                   "l1_bytes": -1})))],
     "'l1_bytes' must be positive"),
    ("target file: UB larger than L1", lambda d: [str(_good(d)), "--target",
                                                  str(_write(d, "t.json", json.dumps({"base": "ascend910b",
                                                                                      "ub_bytes": 1 << 22})))],
     "is larger than 'l1_bytes'"),
    ("target file: unknown key", lambda d: [str(_good(d)), "--target",
                                            str(_write(d, "t.json", json.dumps({"base": "ascend910b",
                                                                                "ub_size": 5})))],
     "unknown target field 'ub_size'"),
    ("target file: bad JSON", lambda d: [str(_good(d)), "--target", str(_write(d, "t.json", "{"))],
     "is not valid JSON"),
    ("unknown target preset", lambda d: [str(_good(d)), "--target", "ascend999"], "unknown target 'ascend999'"),
    ("output dir under a file", lambda d: [str(_good(d)), "-o", str(_write(d, "blocker", "") / "out")],
     "is not writable"),
]


def _outdir(tmp_path):
    return tmp_path / "out"


@pytest.mark.parametrize("build, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_one_line_exit_2(tmp_path, capsys, build, message):
    argv = build(tmp_path)
    if "-o" not in argv:
        argv += ["-o", str(_outdir(tmp_path))]
    assert main(["compile", *argv, "--portable"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ascendfuse: error: ") and message in lines[0], lines[0]
    assert "Traceback" not in err
    assert not _outdir(tmp_path).exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_output_dir_not_writable(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        assert main(["compile", str(_good(tmp_path)), "-o", str(locked / "out")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "is not writable" in err
        assert not any(locked.iterdir())
    finally:
        locked.chmod(0o700)


def test_existing_output_dir_untouched_on_failure(tmp_path, capsys):
    """A failing compile into a dir that already holds files leaves exactly those files."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert main(["compile", *_custom_domain_op(tmp_path), "-o", str(out)]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_process_level_exit_code_and_no_traceback(tmp_path):
    """The console entry point itself: exit status 2 and a single stderr line."""
    proc = subprocess.run([sys.executable, "-m", "tvm_ascendfuse.cli", "compile", *_custom_domain_op(tmp_path),
                           "-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "FooBar" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def message_table(tmp_root) -> list[tuple[str, str]]:
    """(input, exact error line) for every row of CASES; used for the closing note."""
    import contextlib
    import io

    rows = []
    for i, (name, build, _) in enumerate(CASES):
        d = tmp_root / f"case{i}"
        d.mkdir()
        argv = build(d)
        if "-o" not in argv:
            argv += ["-o", str(d / "out")]
        buf = io.StringIO()
        with contextlib.redirect_stderr(buf):
            code = main(["compile", *argv, "--portable"])
        rows.append((name, f"[exit {code}] {buf.getvalue().strip()}"))
    return rows


if __name__ == "__main__":
    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name, msg in message_table(pathlib.Path(tmp)):
            print(f"| {name} | `{msg.replace(tmp, '<tmp>')}` |")


# --- a user pattern whose check raises --------------------------------------------------------------------

@pytest.fixture
def raising_user_pattern():
    """A user-declared pattern (relu(relu(x))) whose check has a bug; removed from the table afterwards."""
    from tvm.relax.dpl import is_op, wildcard

    from tvm_ascendfuse.patterns import registry

    def buggy_check(ctx, target):
        return {}["missing"]            # KeyError: a bug in the user's check

    pat = is_op("relax.nn.relu")(is_op("relax.nn.relu")(wildcard()))
    spec = registry.declare(registry.PatternSpec(
        name="ascendfuse.user.double_relu", switch="TbeEltwiseFusionPass", pattern=pat,
        checks=(buggy_check,), priority=1000))
    yield spec
    registry._TABLE.pop(spec.name, None)


def _double_relu_mod():
    from tvm import relax

    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.relu(relax.op.nn.relu(x)))
        bb.emit_func_output(y)
    return bb.get()


def test_user_pattern_check_raising_names_the_pattern(raising_user_pattern):
    """Decision: an error naming the pattern and its check. Skipping silently would hide that the user's
    pattern never applies; fusing anyway could change answers."""
    from tvm_ascendfuse import compile_model
    from tvm_ascendfuse.errors import PatternCheckError

    with pytest.raises(PatternCheckError) as info:
        compile_model(_double_relu_mod(), portable=True)
    msg = str(info.value)
    assert "ascendfuse.user.double_relu" in msg and "buggy_check" in msg and "KeyError" in msg
    assert "\n" not in msg.strip()


def test_user_pattern_check_raising_in_cli(raising_user_pattern, tmp_path, capsys):
    model = _save(tmp_path, "rr.onnx", relu_model("Relu"))
    assert main(["compile", str(model), "-o", str(tmp_path / "out"), "--portable"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pattern 'ascendfuse.user.double_relu'" in err, err
    assert not (tmp_path / "out").exists()


def test_table_without_user_pattern_still_compiles(tmp_path):
    """The fixture's cleanup leaves the table as it was: the same model compiles."""
    from tests.helpers import assert_same_numbers

    assert_same_numbers(_double_relu_mod())


# --- a shape whose minimal tile cannot fit UB: fall back to TVM's lowering, same numbers ----------------

def test_softmax_row_too_long_for_ub_falls_back():
    """softmax(x * s) over a 96 Ki-element row: one fp32 row alone is 384 KiB > 184 KiB of UB."""
    from tvm import relax

    from tests.helpers import assert_same_numbers

    n = 96 * 1024
    x = relax.Var("x", relax.TensorType((2, n), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.softmax(relax.op.multiply(x, relax.const(0.5, "float32")), axis=-1))
        bb.emit_func_output(y)
    result = assert_same_numbers(bb.get())
    rec = result.report.get("TbeSoftmaxFusionPass")
    assert rec.effect_times == 0
    reasons = [e["reason"] for e in rec.to_dict()["not_effective"]]
    assert "ub_overflow" in reasons, rec.to_dict()
    over = [e for e in rec.to_dict()["not_effective"] if e["reason"] == "ub_overflow"][0]
    assert over["bytes_needed"] > over["bytes_available"]
