"""The records shipped in ``schedules/<target>/<cpu>/``: each one a searched pick that beat its rule's default
(records that only confirm the default are not shipped: the rule builds those itself), measured on the CPU
its folder names; on a host with that CPU, compiling the workload a record was tuned on applies it and
computes what the rules' build computes."""

from pathlib import Path

import numpy as np
import pytest

from tests.helpers import assert_close, run_vm
from tvm_ascendfuse import compile_model
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.schedule.tuned import (RECORDS_FILE, SCHEDULES_ENV, WORKLOADS_FILE, host_cpu, open_database,
                                           tile_decision)
from tvm_ascendfuse.target import get_target
from tvm_ascendfuse.workloads import llama_block

SHIPPED = Path(__file__).resolve().parents[2] / "schedules"
FOLDERS = sorted(p for p in SHIPPED.glob("*/*") if (p / RECORDS_FILE).is_file())


def test_records_are_shipped():
    assert FOLDERS, "no database under schedules/<target>/<cpu>/"


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_record_is_a_searched_pick_measured_on_its_cpu(folder):
    assert (folder / WORKLOADS_FILE).is_file()
    get_target(folder.parent.name)                      # a target preset
    records = list(open_database(folder).get_all_tuning_records())
    assert records
    for r in records:
        assert host_cpu(r.target) == folder.name
        assert tile_decision(r) not in (0, None)
        assert r.run_secs and all(0 < float(s) < 1.0 for s in r.run_secs)


def test_the_llama_block_record_applies_on_its_cpu(monkeypatch):
    """W7's attention kernel has a record for znver4 (tuned on the workload as `ascendfuse workload` writes
    it): applied there, same numbers as the rules' build."""
    npu = get_target("ascend910b")
    cpu = host_cpu(npu.host_target())
    if not (SHIPPED / "ascend910b" / cpu / RECORDS_FILE).is_file():
        pytest.skip(f"no records shipped for this host's CPU ({cpu})")
    model = llama_block()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype("float32")
              for i in model.graph.input]
    untuned = compile_model(import_onnx(model), target="ascend910b")
    assert "tuned" not in untuned.report.sections["schedules"].values()
    monkeypatch.setenv(SCHEDULES_ENV, str(SHIPPED))
    tuned = compile_model(import_onnx(model), target="ascend910b")
    # fails when the kernel the pipeline builds for W7 changed since the records were tuned: tune again
    rules = tuned.report.sections["schedules"]
    assert [k for k, r in rules.items() if r == "tuned"], tuned.report.sections.get("schedule_notes")
    assert_close(run_vm(tuned.executable, inputs), run_vm(untuned.executable, inputs),
                               rtol=1e-4, atol=1e-4)
