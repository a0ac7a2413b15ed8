"""The work dir: state written whole (a kill leaves the old file or the new), a torn database line from a kill
is dropped on reopening, and a search database reopens with what it held."""

import json
import os

from tvm_ascendfuse.tune.workdir import WorkDir, drop_torn_lines, read_json, write_json


def test_write_json_replaces_whole_files(tmp_path):
    path = tmp_path / "a" / "state.json"
    write_json(path, {"measured": 3})
    write_json(path, {"measured": 5})
    assert read_json(path, None) == {"measured": 5}
    assert os.listdir(path.parent) == ["state.json"]             # no temporary file left behind
    assert read_json(tmp_path / "missing.json", {"x": 1}) == {"x": 1}
    (tmp_path / "bad.json").write_text('{"measured": ')
    assert read_json(tmp_path / "bad.json", {}) == {}


def test_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "database_tuning_record.json"
    good = [json.dumps([0, {"a": i}]) for i in range(3)]
    path.write_text("\n".join(good) + '\n[0, {"a": 3')           # killed while appending the fourth
    assert drop_torn_lines(path) == 1
    assert path.read_text().splitlines() == good
    assert drop_torn_lines(path) == 0 and drop_torn_lines(tmp_path / "none.json") == 0


class _Kernel:
    def __init__(self, key, name="k", rule="matmul"):
        self.key, self.name, self.rule = key, name, rule


def test_state_and_profile_round_trip(tmp_path):
    work = WorkDir(tmp_path / "w")
    k = _Kernel("00ff")
    assert work.state(k) == {"measured": 0, "failed": 0}
    work.save_state(k, {"measured": 4, "failed": 1})
    assert WorkDir(tmp_path / "w").state(k) == {"measured": 4, "failed": 1}
    work.save_profile({"00ff": {"name": "k", "us": 12.5}})
    work.save_profile({"0100": {"name": "j", "us": None}})       # merged, not replaced
    assert set(work.profile()) == {"00ff", "0100"}
