"""Model loading (``frontend.py``) refuses unsafe inputs before reading them.

* external data whose ``location`` leaves the model's folder (``../``, an absolute path, a symlink leading out)
  is refused with ``UnsafeModelError`` naming the tensor, and the file is never opened;
* a tensor that declares more bytes than the model or its external file holds is refused, not allocated;
* nothing in the package unpickles a file a user passes (a pickle named ``model.onnx`` is just not ONNX).
"""

from __future__ import annotations

import ast
import builtins
import os
import pickle
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_ascendfuse
from tvm_ascendfuse.cli import main
from tvm_ascendfuse.errors import ModelError, UnsafeModelError
from tvm_ascendfuse.frontend import import_onnx, load_onnx
from tests.helpers import assert_close

W = np.arange(12, dtype="float32").reshape(3, 4) / 7.0


def _model(weight: TensorProto) -> onnx.ModelProto:
    """y = x + W, with W given as ``weight`` (an initializer)."""
    graph = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(weight.dims))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(weight.dims))],
                              initializer=[weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _external(location: str, dims=(3, 4), offset: int | None = None, length: int | None = None) -> TensorProto:
    t = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=list(dims))
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            t.external_data.add(key=key, value=str(value))
    return t


def _save(folder: Path, weight: TensorProto, name="model.onnx") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(_model(weight).SerializeToString())
    return path


@pytest.fixture
def opened(monkeypatch):
    """Paths opened through ``open`` while the test runs (onnx reads external data with it)."""
    seen = []
    real_open = builtins.open

    def spy(file, *args, **kwargs):
        seen.append(os.path.realpath(file) if isinstance(file, (str, os.PathLike)) else file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    return seen


@pytest.fixture
def secret(tmp_path):
    """A file outside the model's folder that a crafted location points at."""
    path = tmp_path / "outside" / "secret.bin"
    path.parent.mkdir()
    path.write_bytes(W.tobytes())
    return path


def test_external_data_inside_the_folder_loads_and_computes(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "weights").mkdir()
    (folder / "weights" / "w.bin").write_bytes(b"\0" * 16 + W.tobytes())
    path = _save(folder, _external("weights/w.bin", offset=16, length=W.nbytes))
    proto = load_onnx(path)
    np.testing.assert_array_equal(numpy_helper.to_array(proto.graph.initializer[0]), W)
    # and through the whole pipeline
    import tvm
    from tvm import relax

    result = tvm_ascendfuse.compile_model(import_onnx(path), portable=True)
    x = np.ones((3, 4), "float32")
    out = relax.VirtualMachine(result.executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert_close(out, x + W, rtol=1e-6)


def test_symlink_inside_the_folder_is_fine(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "real.bin").write_bytes(W.tobytes())
    os.symlink("real.bin", folder / "link.bin")
    np.testing.assert_array_equal(
        numpy_helper.to_array(load_onnx(_save(folder, _external("link.bin"))).graph.initializer[0]), W)


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink_out", "dir_symlink_out", "backslash_dotdot"])
def test_location_outside_the_folder_is_refused_unread(tmp_path, secret, opened, kind):
    folder = tmp_path / "m"
    folder.mkdir()
    if kind == "dotdot":
        location, words = "../outside/secret.bin", "leads out of the model's folder"
    elif kind == "backslash_dotdot":
        location, words = "..\\outside\\secret.bin", "leads out of the model's folder"
    elif kind == "absolute":
        location, words = str(secret), "absolute path"
    elif kind == "symlink_out":
        os.symlink(secret, folder / "w.bin")
        location, words = "w.bin", "symbolic link"
    else:
        os.symlink(secret.parent, folder / "sub")
        location, words = "sub/secret.bin", "symbolic link"
    path = _save(folder, _external(location))
    with pytest.raises(UnsafeModelError, match="tensor 'W'") as err:
        load_onnx(path)
    assert words in str(err.value) and "refused" in str(err.value)
    assert str(secret) not in opened and os.path.realpath(secret) not in opened


def test_etc_passwd_location_is_refused(tmp_path, opened):
    path = _save(tmp_path / "a" / "b", _external("../../../../../../../../etc/passwd"))
    with pytest.raises(UnsafeModelError, match="leads out"):
        load_onnx(path)
    assert "/etc/passwd" not in opened


def test_cli_refuses_with_one_line_and_exit_2(tmp_path, secret, capsys):
    path = _save(tmp_path / "m", _external("../outside/secret.bin"))
    code = main(["compile", str(path), "-o", str(tmp_path / "out"), "--no-traffic-baseline"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "external file '../outside/secret.bin'" in err[0] and "leads out" in err[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_in_memory_model_with_external_data_is_refused(tmp_path):
    with pytest.raises(UnsafeModelError, match="passed in memory"):
        load_onnx(_model(_external("w.bin")))


def _peak_mib(fn) -> float:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / (1 << 20)


def _refused_small(fn, match):
    def run():
        with pytest.raises(UnsafeModelError, match=match):
            fn()
    assert _peak_mib(run) < 64       # refused before anything the size of the declaration was allocated


def test_external_tensor_declaring_more_than_its_file_is_refused(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "w.bin").write_bytes(W.tobytes())
    huge = _save(folder, _external("w.bin", dims=(1 << 20, 1 << 20)), "huge.onnx")    # 4 TiB declared
    _refused_small(lambda: load_onnx(huge), r"declares \[1048576, 1048576\] .* holds 48 bytes")
    past_end = _save(folder, _external("w.bin", offset=40, length=48), "past.onnx")
    _refused_small(lambda: load_onnx(past_end), "reaches beyond the file")
    bad_offset = _save(folder, _external("w.bin", offset=-1), "neg.onnx")
    _refused_small(lambda: load_onnx(bad_offset), "negative offset")


def test_embedded_tensor_declaring_more_than_it_holds_is_refused(tmp_path):
    raw = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[1 << 30, 1 << 30], raw_data=W.tobytes())
    path = _save(tmp_path, raw, "raw.onnx")
    _refused_small(lambda: load_onnx(path), "holds 48 bytes")
    typed = helper.make_tensor("W", TensorProto.FLOAT, [3, 4], W.ravel().tolist())
    del typed.dims[:]
    typed.dims.extend([1 << 40])
    path = _save(tmp_path, typed, "typed.onnx")
    _refused_small(lambda: load_onnx(path), "holds 12")
    # in memory too, and in a Constant node's tensor attribute
    const = helper.make_node("Constant", [], ["W"], value=raw)
    graph = helper.make_graph([const, helper.make_node("Relu", ["W"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    _refused_small(lambda: load_onnx(helper.make_model(graph)), "tensor 'W' declares")


class _Payload:
    """Unpickling this creates ``marker``: evidence that something unpickled the file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_passed_as_model_or_report_is_never_unpickled(tmp_path, capsys):
    marker = tmp_path / "unpickled"
    for name in ("model.onnx", "fusion_result.json"):
        (tmp_path / name).write_bytes(pickle.dumps(_Payload(str(marker))))
    with pytest.raises(ModelError, match="not a readable ONNX model"):
        load_onnx(tmp_path / "model.onnx")
    assert main(["compile", str(tmp_path / "model.onnx"), "-o", str(tmp_path / "out")]) == 2
    assert main(["report", str(tmp_path / "fusion_result.json")]) == 2
    assert not marker.exists()


_UNPICKLERS = {"pickle", "cloudpickle", "dill", "joblib", "shelve", "marshal"}
_TORCH_LOADERS = {"load", "load_state_dict"}     # torch.load, torch.export.load: pickles inside


def test_no_module_of_the_package_can_unpickle():
    """No import of a pickle-family module, no ``np.load(..., allow_pickle=True)`` anywhere in the package
    (the tuner names cloudpickle only as a dependency of MetaSchedule's own worker processes), and torch's
    loaders are called only under ``torch_frontend._weights_only_unpickling``."""
    root = Path(tvm_ascendfuse.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        guarded = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.With) and any("_weights_only_unpickling" in ast.unparse(i.context_expr)
                                                  for i in node.items):
                guarded.update(id(n) for n in ast.walk(node))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _TORCH_LOADERS and ast.unparse(node.func).startswith("torch.")
                    and id(node) not in guarded):
                found.append((path.name, ast.unparse(node.func)))
            if isinstance(node, ast.Import):
                found += [(path.name, a.name) for a in node.names if a.name.split(".")[0] in _UNPICKLERS]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _UNPICKLERS:
                found.append((path.name, node.module))
            elif isinstance(node, ast.Call) and any(k.arg == "allow_pickle" for k in node.keywords):
                found.append((path.name, "allow_pickle"))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
                found.append((path.name, "__import__"))
    assert not found, found


def test_a_pickle_inside_a_pt2_is_never_run(tmp_path, monkeypatch):
    """torch.export.load retries a payload its weights-only loader refuses with the full unpickler; under our
    loader that retry is refused too, and the file is reported as unreadable."""
    torch = pytest.importorskip("torch")
    import io

    from tvm_ascendfuse.torch_frontend import load_exported_program

    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Payload(str(marker)))

    def load_like_torch_export(path, *args, **kwargs):
        try:
            return torch.load(io.BytesIO(payload), weights_only=True)
        except Exception:
            return torch.load(io.BytesIO(payload), weights_only=False)   # what torch.export.load does

    monkeypatch.setattr(torch.export, "load", load_like_torch_export)
    path = tmp_path / "model.pt2"
    path.write_bytes(b"placeholder")
    with pytest.raises(ModelError, match="not a readable torch.export program"):
        load_exported_program(path)
    assert not marker.exists()
