"""Run the conformance cases through TVM's default pipeline and ours; print and save the tally.

    python -m tests.conformance.sweep [--families conv gemm ...] [--json out.json]

A regression is a case the default pipeline passes and ours does not. Cases the default pipeline fails are
listed with TVM's error (not ours to fix) and not counted against us.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from tests.conformance.onnx_cases import (OP_MODULES, Outcome, _first_line, compile_ascendfuse, compile_default,
                                          freeze_int_inputs, import_case, load_cases, run_case)


def compare_case(case):
    """(variant, default outcome, our outcome). When TVM cannot import the case as given, the variant with
    integer inputs frozen into initializers is tried (runtime axes/shapes are what the importer lacks)."""
    variants = [("as_is", None, None)]
    frozen = freeze_int_inputs(case)
    if frozen is not None:
        variants.append(("frozen_int_inputs", *frozen))
    for variant, model, inputs in variants:
        try:
            mod = import_case(case, model)
        except Exception as err:
            ref = ours = Outcome("import_error", _first_line(err))
            continue
        ref = run_case(case, compile_default, mod, inputs)
        ours = run_case(case, compile_ascendfuse, mod, inputs)
        return variant, ref, ours
    return "as_is", ref, ours


def sweep(cases, log=print) -> dict:
    rows = []
    for fam, case in cases:
        t0 = time.perf_counter()
        variant, ref, ours = compare_case(case)
        row = {"family": fam, "case": case.name, "variant": variant, "default": ref.status,
               "default_detail": ref.detail,
               "ours": ours.status, "ours_detail": ours.detail, "seconds": round(time.perf_counter() - t0, 2)}
        rows.append(row)
        flag = "REGRESSION" if ref.ok and not ours.ok else ""
        log(f"{case.name:60s} {variant:17s} default={ref.status:13s} ours={ours.status:13s} {flag} "
            f"{ours.detail if flag else ''}", flush=True)
    regress = [r for r in rows if r["default"] == "pass" and r["ours"] != "pass"]
    tvm_fail = [r for r in rows if r["default"] != "pass"]
    fixed = [r for r in tvm_fail if r["ours"] == "pass"]
    return {"cases": len(rows), "frozen_variant": sum(r["variant"] != "as_is" for r in rows),
            "default_pass": len(rows) - len(tvm_fail), "default_fail": len(tvm_fail),
            "default_fail_by_status": dict(Counter(r["default"] for r in tvm_fail)),
            "regressions": regress, "ours_pass_where_default_fails": [r["case"] for r in fixed],
            "default_failures": [{k: r[k] for k in ("case", "default", "default_detail")} for r in tvm_fail],
            "rows": rows}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--families", nargs="*", default=list(OP_MODULES))
    p.add_argument("--json")
    a = p.parse_args(argv)
    res = sweep(load_cases(a.families))
    print(f"\ncases {res['cases']} (run with int inputs frozen: {res['frozen_variant']})  default passes {res['default_pass']}  default fails {res['default_fail']} "
          f"{res['default_fail_by_status']}  regressions {len(res['regressions'])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
