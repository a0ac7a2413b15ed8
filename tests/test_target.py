import json

import pytest

from tvm_ascendfuse import PRESETS, TargetError, get_target, load_target_file, make_target
from tvm_ascendfuse.target import register_host_tags


def test_presets_public_figures():
    t = get_target("ascend910b")
    assert t.ub_bytes == 192 * 1024 and t.ub_usable == 184 * 1024
    assert (t.l1_bytes, t.l0a_bytes, t.l0b_bytes, t.l0c_bytes) == (512 * 1024, 64 * 1024, 64 * 1024, 128 * 1024)
    assert (t.cube_cores, t.vector_cores, t.clock_ghz) == (24, 48, 1.8)
    assert (t.ub_align, t.l0ab_align, t.l0c_align) == (32, 512, 64)
    p = get_target("ascend310p")
    assert (p.ub_bytes, p.l1_bytes, p.l0c_bytes, p.cube_cores) == (256 * 1024, 1024 * 1024, 256 * 1024, 8)
    # 24 cores x 16x16x16 MACs x 2 FLOPs x 1.8 GHz
    assert t.cube_flops() == pytest.approx(24 * 4096 * 2 * 1.8e9)


def test_capacity_and_alignment():
    t = get_target("ascend910b")
    assert t.capacity("local.UB") == t.ub_usable
    assert t.capacity("local.L0C") == 128 * 1024
    assert t.align_up(1) == 32 and t.align_up(33) == 64 and t.align_up(1, "l0a") == 512
    with pytest.raises(TargetError, match="unknown on-chip scope"):
        t.capacity("local.XYZ")


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_load_file_with_base_and_override(tmp_path, suffix):
    f = tmp_path / f"npu{suffix}"
    if suffix == ".json":
        f.write_text(json.dumps({"base": "ascend310p", "name": "mine", "hbm_gbps": 100}))
    else:
        f.write_text('base = "ascend310p"\nname = "mine"\nhbm_gbps = 100\n')
    t = load_target_file(f)
    assert t.name == "mine" and t.hbm_gbps == 100.0 and t.ub_bytes == PRESETS["ascend310p"].ub_bytes
    assert get_target(str(f), ub_reserved_bytes=0).ub_usable == t.ub_bytes


def test_full_file_without_base(tmp_path):
    fields = {k: v for k, v in PRESETS["ascend910b"].to_dict().items()}
    f = tmp_path / "full.json"
    f.write_text(json.dumps(fields))
    assert load_target_file(f) == PRESETS["ascend910b"]
    del fields["l1_bytes"]
    f.write_text(json.dumps(fields))
    with pytest.raises(TargetError, match="missing field.*l1_bytes"):
        load_target_file(f)


@pytest.mark.parametrize("override,match", [
    ({"ub_bytes": -1}, "'ub_bytes' must be positive"),
    ({"ub_bytes": 4 * 1024 * 1024}, "'ub_bytes'.*larger than 'l1_bytes'"),
    ({"ub_reserved_bytes": 192 * 1024}, "'ub_reserved_bytes'"),
    ({"ub_align": 24}, "'ub_align' must be a power of two"),
    ({"l0a_bytes": "big"}, "'l0a_bytes' must be a number"),
    ({"cube_cores": 2.5}, "'cube_cores' must be a whole number"),
    ({"colour": 3}, "unknown target field 'colour'"),
])
def test_bad_fields_are_named(override, match):
    with pytest.raises(TargetError, match=match):
        make_target("ascend910b", **override)


def test_bad_files(tmp_path):
    with pytest.raises(TargetError, match="cannot read target file"):
        load_target_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TargetError, match="not valid JSON"):
        load_target_file(bad)
    with pytest.raises(TargetError, match="unknown target preset 'ascend999'"):
        bad.write_text(json.dumps({"base": "ascend999"}))
        load_target_file(bad)
    with pytest.raises(TargetError, match="unknown target 'nonsense'"):
        get_target("nonsense")


def test_host_target():
    import tvm

    t = get_target("ascend910b")
    native = t.host_target()
    assert native.kind.name == "llvm" and "ascend" in native.keys
    assert str(native.attrs["mcpu"]) == tvm.target.codegen.llvm_get_system_cpu()
    assert "mcpu" not in t.host_target(portable=True).attrs
    register_host_tags()
    tagged = tvm.target.Target("ascend/ascend310p")
    assert tagged.attrs["model"] == "ascend310p" and "ascend" in tagged.keys
